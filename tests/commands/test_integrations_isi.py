"""``integrations add isi`` and ``integrations check-connection`` through call_command, as an
operator runs them, against a real loopback ISI API."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from devtools.broker_simulator import Reply
from devtools.isi_simulator import IsiSimulator, connection
from integrations.models import Broker, Integration, IsiConnection, LedgerEvent
from integrations.services.staff.integrations import integration_retire
from tests.builders import CONNECTION_A, CONNECTION_B, CONNECTION_STANDARD, broker_connections

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def api() -> Iterator[IsiSimulator]:
    with IsiSimulator(connections=broker_connections(), token="static-t0ken") as running:
        yield running


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def add_isi(api: IsiSimulator, *auth: str) -> list[str]:
    return [
        "integrations", "add", "isi", "--broker", "4821", "--name", "Acme API",
        "--base-url", api.base_url, *auth,
    ]  # fmt: skip


def oauth(api: IsiSimulator) -> list[str]:
    return [
        "--token-url", api.token_url, "--client-id", api.client_id,
        "--client-secret", api.client_secret,
    ]  # fmt: skip


def test_add_isi_with_oauth_prints_uuid_secret_and_connections(
    broker: Broker, api: IsiSimulator
) -> None:
    out, err = run(*add_isi(api, *oauth(api)), "--json")

    result = json.loads(out)
    integration = Integration.objects.get()
    assert result["uuid"] == str(integration.uuid)
    assert re.fullmatch(r"whsec_[A-Za-z0-9_-]{43}", result["webhook_secret"])
    assert result["webhook_secret"] == integration.webhook_secret
    assert (result["kind"], result["auth"], result["base_url"]) == ("isi", "oauth", api.base_url)
    assert result["connections_error"] == ""
    assert {c["uuid"]: c["takes_part_in_drop"] for c in result["connections"]} == {
        CONNECTION_A: True,
        CONNECTION_B: True,
        CONNECTION_STANDARD: False,
    }
    standard = next(c for c in result["connections"] if c["uuid"] == CONNECTION_STANDARD)
    assert standard["not_taking_part_because"] == (
        "lacks privacy/drop/identifiers and privacy/drop/delete"
    )
    assert err == ""
    ledger = json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))
    assert api.client_secret not in ledger


def test_add_isi_with_a_static_token_in_plain_text(broker: Broker, api: IsiSimulator) -> None:
    out, _ = run(*add_isi(api, "--token", "static-t0ken"))

    integration = Integration.objects.get()
    assert integration.auth == "token"
    assert f"Integration {integration.uuid} (Acme API) added." in out
    assert integration.webhook_secret in out
    assert "shown once" in out
    assert "Connections: 2 of 3 take part in DROP." in out
    assert f"{CONNECTION_STANDARD}  not: lacks privacy/drop/identifiers" in out


def test_add_isi_whose_api_does_not_answer_still_shows_the_secret_once(
    broker: Broker, api: IsiSimulator
) -> None:
    api.answer_next("connections", Reply(500, b"down for maintenance"))

    out, err = run(*add_isi(api, *oauth(api)), "--json")

    result = json.loads(out)
    assert result["webhook_secret"] == Integration.objects.get().webhook_secret
    assert result["connections"] == []
    assert result["connections_error"].endswith("HTTP 500")
    assert f"integrations check-connection {result['uuid']}" in err


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        (["--token", "t", "--token-url", "https://auth.example/token"], "not both"),
        ([], "auth: a static token, or OAuth client credentials"),
        (["--token-url", "https://auth.example/token", "--client-id", "i"], "client_secret"),
    ],
)
def test_add_isi_refuses_bad_authentication_and_writes_nothing(
    broker: Broker, api: IsiSimulator, auth: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run(*add_isi(api, *auth))

    assert not Integration.objects.exists()
    assert api.received == []


def test_add_isi_refuses_plain_http_in_production(broker: Broker, settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = False

    with pytest.raises(CommandError, match="base_url: plain http is refused"):
        run(
            "integrations", "add", "isi", "--broker", "4821", "--name", "Acme API",
            "--base-url", "http://api.acme.example", "--token", "t",
        )  # fmt: skip

    assert not Integration.objects.exists()


def test_add_isi_refuses_a_base_url_with_a_query(broker: Broker, api: IsiSimulator) -> None:
    with pytest.raises(CommandError, match=re.escape("base_url: a base URL must end at its path")):
        run(
            "integrations", "add", "isi", "--broker", "4821", "--name", "Acme API",
            "--base-url", f"{api.base_url}/isi?tenant=7", "--token", "t",
        )  # fmt: skip

    assert not Integration.objects.exists()
    assert api.received == []


def test_check_connection_lists_again_and_says_what_changed(
    broker: Broker, api: IsiSimulator
) -> None:
    out, _ = run(*add_isi(api, *oauth(api)), "--json")
    uuid = json.loads(out)["uuid"]
    api.connections = [connection(CONNECTION_A), connection(CONNECTION_B, ["privacy/access"])]

    out, _ = run("integrations", "check-connection", uuid, "--json")

    result = json.loads(out)
    assert (result["method"], result["status"]) == ("POST", 200)
    assert {c["uuid"]: c["not_taking_part_because"] for c in result["connections"]} == {
        CONNECTION_A: "",
        CONNECTION_B: "lacks privacy/drop/identifiers and privacy/drop/delete",
        CONNECTION_STANDARD: "no longer listed by the broker; "
        "lacks privacy/drop/identifiers and privacy/drop/delete",
    }
    assert IsiConnection.objects.filter(listed=True).count() == 2


def test_check_connection_failure_is_one_clear_error(broker: Broker, api: IsiSimulator) -> None:
    out, _ = run(*add_isi(api, *oauth(api)), "--json")
    uuid = json.loads(out)["uuid"]
    api.answer_next("connections", Reply(200, b"<html>login</html>"))

    with pytest.raises(CommandError, match=r"connections not listed: .* is not JSON"):
        run("integrations", "check-connection", uuid)

    assert IsiConnection.objects.filter(listed=True).count() == 3


def test_check_connection_of_a_webhook_integration_is_refused(broker: Broker) -> None:
    out, _ = run(
        "integrations", "add", "webhook", "--broker", "4821", "--name", "CRM",
        "--url", "https://crm.acme.example/drop", "--json",
    )  # fmt: skip

    with pytest.raises(CommandError, match="only ISI integrations have connections"):
        run("integrations", "check-connection", json.loads(out)["uuid"])


def test_the_client_secret_and_token_can_come_from_a_file_or_standard_input(
    broker: Broker, api: IsiSimulator, tmp_path: Any
) -> None:
    secret_file = tmp_path / "client.secret"
    secret_file.write_text(api.client_secret + "\n")
    oauth_from_file = [
        "--token-url", api.token_url, "--client-id", api.client_id,
        "--client-secret-file", str(secret_file),
    ]  # fmt: skip

    run(*add_isi(api, *oauth_from_file))
    out, err = io.StringIO(), io.StringIO()
    call_command(
        *add_isi(api, "--token-file", "-"), "--name", "Static",
        stdin=io.StringIO("static-t0ken\n"), stdout=out, stderr=err,
    )  # fmt: skip

    oauth_one, static_one = Integration.objects.order_by("pk")
    assert oauth_one.client_secret == api.client_secret
    assert static_one.token == "static-t0ken"


def test_check_connection_of_a_retired_integration_calls_nothing(
    broker: Broker, api: IsiSimulator
) -> None:
    out, _ = run(*add_isi(api, *oauth(api)), "--json")
    integration = Integration.objects.get(uuid=json.loads(out)["uuid"])
    integration_retire(integration=integration, reason="API decommissioned", actor="test")
    calls = len(api.received)

    with pytest.raises(CommandError, match=r"was retired \(API decommissioned\): nothing more"):
        run("integrations", "check-connection", str(integration.uuid))

    assert len(api.received) == calls  # neither its token URL nor its API is called


@pytest.mark.parametrize(
    ("auth", "stdin"),
    [
        (["--client-secret-file", "-"], b"\xff\xfe-secret\n"),
        (["--token-file", "-"], b"static-t0ken\xff\n"),
    ],
    ids=["client-secret", "token"],
)
def test_a_secret_on_stdin_that_is_not_utf8_is_one_line_and_adds_nothing(
    broker: Broker, api: IsiSimulator, auth: list[str], stdin: bytes
) -> None:
    if auth[0] == "--client-secret-file":
        auth = ["--token-url", api.token_url, "--client-id", api.client_id, *auth]
    # As a process reads its stdin under a UTF-8 locale: bad bytes become surrogates.
    piped = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8", errors="surrogateescape")

    with pytest.raises(CommandError, match=r"^cannot read standard input: not UTF-8 text$"):
        call_command(*add_isi(api, *auth), stdin=piped, stdout=io.StringIO())

    assert not Integration.objects.exists()
    assert api.received == []


def test_a_secret_argument_that_is_not_utf8_is_one_line_and_adds_nothing(
    broker: Broker, api: IsiSimulator
) -> None:
    # An argument's bytes that are not UTF-8 reach Python as surrogates, as from stdin.
    auth = oauth(api)
    auth[-1] = "\udcff\udcfe-secret"

    with pytest.raises(CommandError, match=r"^cannot read --client-secret: not UTF-8 text$"):
        run(*add_isi(api, *auth))

    assert not Integration.objects.exists()


def test_a_byte_order_mark_before_a_client_secret_is_not_stored(
    broker: Broker, api: IsiSimulator, tmp_path: Any
) -> None:
    secret_file = tmp_path / "client.secret"
    secret_file.write_bytes(b"\xef\xbb\xbf" + api.client_secret.encode() + b"\n")

    run(*add_isi(
        api, "--token-url", api.token_url, "--client-id", api.client_id,
        "--client-secret-file", str(secret_file),
    ))  # fmt: skip

    assert Integration.objects.get().client_secret == api.client_secret


def test_a_client_secret_with_a_control_character_is_one_line_and_adds_nothing(
    broker: Broker, api: IsiSimulator
) -> None:
    auth = ["--token-url", api.token_url, "--client-id", api.client_id]
    stdin = io.StringIO(api.client_secret + "\x00\n")

    with pytest.raises(CommandError) as refused:
        call_command(*add_isi(api, *auth, "--client-secret-file", "-"), stdin=stdin)

    assert str(refused.value) == (
        r"standard input gave a client secret with a control character (\x00) in it"
    )
    assert not Integration.objects.exists()
