"""``integrations add webhook``, ``integrations rotate-secret``, ``integrations list`` and
``saas add``/``saas list``, through call_command as an operator runs them."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from integrations.models import Broker, Integration, LedgerEvent, SaasConnection

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json"))


def test_add_webhook_prints_the_uuid_and_the_secret(broker: Broker) -> None:
    result = run_json(
        "integrations", "add", "webhook", "--broker", "4821", "--name", "Acme CRM",
        "--url", "https://crm.acme.example/drop",
    )  # fmt: skip

    integration = Integration.objects.get()
    assert result["uuid"] == str(integration.uuid)
    assert result["webhook_secret"] == integration.webhook_secret
    assert re.fullmatch(r"whsec_[A-Za-z0-9_-]{43}", result["webhook_secret"])
    assert (integration.kind, integration.name, integration.url) == (
        "webhook",
        "Acme CRM",
        "https://crm.acme.example/drop",
    )
    event = LedgerEvent.objects.get(kind="integration.created")
    assert event.actor.startswith("cli")
    assert result["webhook_secret"] not in json.dumps(event.data)


def test_add_webhook_in_plain_text_says_the_secret_is_shown_once(broker: Broker) -> None:
    out = run(
        "integrations", "add", "webhook", "--broker", "4821", "--name", "Acme CRM",
        "--url", "https://crm.acme.example/drop",
    )  # fmt: skip

    assert Integration.objects.get().webhook_secret in out
    assert "shown once" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--broker", "9999", "--name", "N", "--url", "https://x.example/h"], "no broker"),
        (["--broker", "4821", "--name", "N", "--url", "http://x.example/h"], "plain http"),
        (["--broker", "4821", "--name", "N", "--url", "not a url"], "not an absolute"),
        (["--broker", "4821", "--name", " ", "--url", "https://x.example/h"], "name"),
    ],
)
def test_add_webhook_refuses_bad_input_and_writes_nothing(
    broker: Broker, args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run("integrations", "add", "webhook", *args)

    assert not Integration.objects.exists()
    assert not LedgerEvent.objects.filter(kind="integration.created").exists()


def test_rotate_secret_keeps_the_old_one_valid_for_24_hours(broker: Broker) -> None:
    first = run_json(
        "integrations", "add", "webhook", "--broker", "4821", "--name", "Acme CRM",
        "--url", "https://crm.acme.example/drop",
    )  # fmt: skip
    before = timezone.now()

    rotated = run_json("integrations", "rotate-secret", first["uuid"])

    integration = Integration.objects.get()
    assert rotated["webhook_secret"] == integration.webhook_secret != first["webhook_secret"]
    assert integration.previous_webhook_secret == first["webhook_secret"]
    valid_until = dt.datetime.fromisoformat(rotated["previous_secret_valid_until"])
    assert (
        dt.timedelta(hours=23, minutes=59)
        < valid_until - before
        <= dt.timedelta(hours=24, seconds=5)
    )
    assert LedgerEvent.objects.filter(kind="integration.secret_rotated").count() == 1


@pytest.mark.parametrize("value", ["not-a-uuid", "3f2b8c1e-0d4a-4e6b-9c7d-5a1e2f3b4c5d"])
def test_rotate_secret_of_an_unknown_integration_is_one_clear_error(
    broker: Broker, value: str
) -> None:
    with pytest.raises(CommandError, match="integration"):
        run("integrations", "rotate-secret", value)


def test_list_shows_integrations(broker: Broker) -> None:
    run(
        "integrations",
        "add",
        "webhook",
        "--broker",
        "4821",
        "--name",
        "A",
        "--url",
        "https://a.example/h",
    )

    (row,) = run_json("integrations", "list")["items"]

    assert (row["name"], row["kind"], row["enabled"]) == ("A", "webhook", True)


def test_saas_add_with_token_and_categories(broker: Broker) -> None:
    result = run_json(
        "saas", "add", "--broker", "4821", "--name", "Mailer",
        "--url", "https://api.mailer.example/erase", "--token", "tok-1",
        "--categories", "email,phone",
    )  # fmt: skip

    connection_ = SaasConnection.objects.get()
    assert result["id"] == connection_.pk
    assert result["uuid"] == str(connection_.uuid)
    assert connection_.token == "tok-1"
    assert connection_.identifier_categories == ["email", "phone"]
    assert result["token_set"] is True
    assert "tok-1" not in json.dumps(result)
    assert LedgerEvent.objects.get(kind="saas_connection.created").data["categories"] == [
        "email",
        "phone",
    ]


def test_saas_add_defaults_to_email_and_refuses_bad_categories(broker: Broker) -> None:
    run("saas", "add", "--broker", "4821", "--name", "M", "--url", "https://m.example/erase")
    assert SaasConnection.objects.get().identifier_categories == ["email"]

    with pytest.raises(CommandError, match="not a category name"):
        run(
            "saas", "add", "--broker", "4821", "--name", "N", "--url", "https://n.example/e",
            "--categories", "email,Phone Number",
        )  # fmt: skip
    assert SaasConnection.objects.count() == 1
    assert run_json("saas", "list")["items"][0]["categories"] == ["email"]


def test_saas_add_takes_its_token_from_a_file(broker: Broker, tmp_path: Any) -> None:
    token_file = tmp_path / "mailer.token"
    token_file.write_text("tok-1\n")

    run(
        "saas", "add", "--broker", "4821", "--name", "Mailer",
        "--url", "https://api.mailer.example/erase", "--token-file", str(token_file),
    )  # fmt: skip

    assert SaasConnection.objects.get().token == "tok-1"


def test_add_webhook_with_a_port_past_65535_is_one_clear_error(broker: Broker) -> None:
    with pytest.raises(CommandError) as refused:
        run(
            "integrations", "add", "webhook", "--broker", "4821", "--name", "CRM",
            "--url", "https://example.com:99999/x",
        )  # fmt: skip

    assert str(refused.value) == (
        "url: not a readable URL: a port is a number up to 65535, an IPv6 host in [ ]"
    )
    assert not Integration.objects.exists()


def test_rotate_secret_of_a_retired_integration_is_refused_as_enable_is(broker: Broker) -> None:
    added = run_json(
        "integrations", "add", "webhook", "--broker", "4821", "--name", "Acme CRM",
        "--url", "https://crm.acme.example/drop",
    )  # fmt: skip
    run("integrations", "retire", added["uuid"], "--reason", "CRM decommissioned")
    events = LedgerEvent.objects.count()

    for action in ("rotate-secret", "enable"):
        with pytest.raises(CommandError, match=r"\(CRM decommissioned\): retired is final"):
            run("integrations", action, added["uuid"])

    integration = Integration.objects.get()
    assert integration.webhook_secret == added["webhook_secret"]
    assert not integration.previous_webhook_secret
    assert LedgerEvent.objects.count() == events


@pytest.mark.parametrize("given", ["", ",,", " , "])
def test_saas_add_refuses_categories_that_name_none(broker: Broker, given: str) -> None:
    # Not given at all is the default, email; given empty is a mistake, not that default.
    with pytest.raises(CommandError) as refused:
        run(
            "saas", "add", "--broker", "4821", "--name", "M", "--url", "https://m.example/erase",
            "--categories", given,
        )  # fmt: skip

    assert str(refused.value) == (
        "categories: name at least one identifier category (lower-case, like email)"
    )
    assert not SaasConnection.objects.exists()


def test_saas_add_shows_only_the_start_of_a_huge_bad_category(broker: Broker) -> None:
    with pytest.raises(CommandError) as refused:
        run(
            "saas", "add", "--broker", "4821", "--name", "M", "--url", "https://m.example/erase",
            "--categories", "email,\x1b[2J" + "X" * 10_000,
        )  # fmt: skip

    assert str(refused.value) == (
        r"categories: not a category name: \x1b[2J" + "X" * 36 + "... (lower-case, like email)"
    )
    assert not SaasConnection.objects.exists()
