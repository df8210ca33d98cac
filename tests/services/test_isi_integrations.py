"""ISI integrations against a real loopback ISI API: creating them (connections listed at
once), reading the connection list (POST, GET on 405), which connections take part and why
the others do not, OAuth tokens (cached, refreshed once on a 401), and every fault of the
broker's API, none of which changes what is stored.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from base64 import b64encode
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote_plus

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.broker_simulator import Reply
from devtools.isi_simulator import IsiSimulator
from devtools.isi_simulator import connection as listed
from integrations import enqueue
from integrations.dispatch.isi import ERROR_TEXT_NOT_SHOWN, IsiError, oauth_token_fetch
from integrations.models import (
    DeletionRequest,
    Integration,
    IsiConnection,
    LedgerEvent,
    RequestState,
)
from integrations.redaction import text_redacted
from integrations.services.cycle import isi_tokens
from integrations.services.cycle.isi_connections import (
    isi_connections_refresh,
    isi_connections_refresh_for_broker,
)
from integrations.services.cycle.isi_tokens import isi_access_token
from integrations.services.staff.isi import isi_integration_create, isi_integration_update
from tests.builders import (
    CONNECTION_A,
    CONNECTION_B,
    CONNECTION_STANDARD,
    DeletionRequestFactory,
    broker_connections,
    isi_integration_created,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def api() -> Iterator[IsiSimulator]:
    with IsiSimulator(connections=broker_connections(), token="static-t0ken") as running:
        yield running


def _stored() -> dict[str, tuple[list[str], bool]]:
    return {str(c.uuid): (c.capabilities, c.listed) for c in IsiConnection.objects.all()}


def _raw(column: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM integrations_integration")  # noqa: S608
        return str(cursor.fetchone()[0])


# -- creating and listing -------------------------------------------------------------------


def test_creating_lists_the_connections_and_only_those_with_both_capabilities_take_part(
    broker, api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, api)

    assert created.connections_error == ""
    assert created.webhook_secret.startswith("whsec_")
    verdicts = {str(c.uuid): (c.takes_part_in_drop, c.drop_exclusion) for c in created.connections}
    assert verdicts == {
        CONNECTION_A: (True, ""),
        CONNECTION_B: (True, ""),
        CONNECTION_STANDARD: (
            False,
            "lacks privacy/drop/identifiers and privacy/drop/delete",
        ),
    }
    integration = created.integration
    assert (integration.kind, integration.auth, integration.base_url) == (
        "isi",
        "oauth",
        api.base_url,
    )
    assert integration.connections_refreshed_at is not None
    assert api.paths == ["/oauth/token", "/api/v1/connections/list"]
    assert api.on("connections")[0].method == "POST"
    event = LedgerEvent.objects.get(kind="isi.connections_refreshed")
    assert event.data["taking_part"] == sorted([CONNECTION_A, CONNECTION_B])
    assert event.data["not_taking_part"] == {
        CONNECTION_STANDARD: "lacks privacy/drop/identifiers and privacy/drop/delete"
    }


def test_credentials_and_the_cached_token_are_encrypted_and_never_in_the_ledger(
    broker, api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, api)
    integration = Integration.objects.get(pk=created.integration.pk)

    assert integration.client_secret == api.client_secret
    assert integration.access_token.startswith("tok-")
    for column, clear in [
        ("client_secret", api.client_secret),
        ("access_token", integration.access_token),
        ("webhook_secret", created.webhook_secret),
    ]:
        assert clear not in _raw(column)
    ledger = json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))
    for secret in (api.client_secret, integration.access_token, created.webhook_secret):
        assert secret not in ledger
    created_event = LedgerEvent.objects.get(kind="integration.created")
    assert created_event.data == {
        "kind": "isi",
        "name": "Acme API",
        "base_url": api.base_url,
        "auth": "oauth",
        "token_url": api.token_url,
        "client_id": "dropportal",
    }


def test_a_static_token_is_sent_as_the_bearer(broker, api: IsiSimulator) -> None:
    created = isi_integration_created(broker, api, oauth=False)

    assert created.connections_error == ""
    assert api.paths == ["/api/v1/connections/list"]  # no token endpoint
    assert api.on("connections")[0].headers["Authorization"] == "Bearer static-t0ken"


def test_the_list_is_asked_by_get_when_post_is_answered_405(broker, api: IsiSimulator) -> None:
    api.list_method = "GET"

    created = isi_integration_created(broker, api)

    assert created.connections_error == ""
    assert [r.method for r in api.on("connections")] == ["POST", "GET"]
    assert len(created.connections) == 3
    assert LedgerEvent.objects.get(kind="isi.connections_refreshed").data["method"] == "GET"


def test_a_connection_uuid_listed_in_upper_case_is_taken_as_its_uuid(
    broker, api: IsiSimulator
) -> None:
    # The broker mints connection UUIDs: any case, unlike a request_uuid the service wrote.
    api.connections = [listed(CONNECTION_A.upper())]

    created = isi_integration_created(broker, api)

    assert created.connections_error == ""
    assert [str(c.uuid) for c in created.connections] == [CONNECTION_A]


def test_a_connection_no_longer_listed_is_kept_but_no_longer_takes_part(
    broker, api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, api)
    api.connections = [listed(CONNECTION_A), listed(CONNECTION_B, ["privacy/drop/delete"])]

    refreshed = isi_connections_refresh(integration=created.integration, actor="test")

    assert [str(c.uuid) for c in refreshed.taking_part] == [CONNECTION_A]
    reasons = {str(c.uuid): c.drop_exclusion for c in refreshed.connections}
    assert reasons == {
        CONNECTION_A: "",
        CONNECTION_B: "lacks privacy/drop/identifiers",
        CONNECTION_STANDARD: "no longer listed by the broker; "
        "lacks privacy/drop/identifiers and privacy/drop/delete",
    }
    event = LedgerEvent.objects.filter(kind="isi.connections_refreshed").latest("id")
    assert event.data["no_longer_listed"] == [CONNECTION_STANDARD]


# -- the broker's API misbehaves: refused, nothing stored changes ----------------------------

BAD_LISTS: dict[str, tuple[Reply, str]] = {
    "not JSON": (Reply(200, b"<html>maintenance</html>"), "the connection list is not JSON"),
    "no results": (
        Reply(200, b'{"connections": []}'),
        "the connection list is not a JSON object with a 'results' array",
    ),
    "results not an array": (
        Reply(200, b'{"results": {"uuid": "x"}}'),
        "the connection list is not a JSON object with a 'results' array",
    ),
    "an entry without a UUID": (
        Reply(200, b'{"results": [{"capabilities": []}]}'),
        "results[0].uuid is not a UUID (8-4-4-4-12 hexadecimal digits)",
    ),
    "a UUID in another spelling": (
        Reply(200, json.dumps({"results": [listed("{" + CONNECTION_A + "}")]}).encode()),
        "results[0].uuid is not a UUID (8-4-4-4-12 hexadecimal digits)",
    ),
    "a UUID without its dashes": (
        Reply(200, json.dumps({"results": [listed(CONNECTION_A.replace("-", ""))]}).encode()),
        "results[0].uuid is not a UUID (8-4-4-4-12 hexadecimal digits)",
    ),
    "capabilities not an array": (
        Reply(
            200, json.dumps({"results": [{"uuid": CONNECTION_A, "capabilities": "all"}]}).encode()
        ),
        "results[0].capabilities is not an array of capability names",
    ),
    "a connection twice": (
        Reply(200, json.dumps({"results": [listed(CONNECTION_A), listed(CONNECTION_A)]}).encode()),
        f"results[1]: connection {CONNECTION_A} is listed twice",
    ),
    "a capability PostgreSQL cannot store": (
        Reply(
            200,
            json.dumps(
                {"results": [listed(CONNECTION_A), listed(CONNECTION_B, ["drop\x00"])]}
            ).encode(),
        ),
        "the connection list cannot be stored: a string holds a NUL character (\\u0000)",
    ),
    "server error": (Reply(500, b"oops"), "HTTP 500"),
    "a redirect": (Reply.redirect(), "HTTP 301 (redirect not followed (301))"),
}


@pytest.mark.parametrize("case", BAD_LISTS, ids=list(BAD_LISTS))
def test_a_bad_connection_list_is_refused_and_the_stored_one_kept(
    broker, api: IsiSimulator, case: str
) -> None:
    created = isi_integration_created(broker, api)
    before = _stored()
    reply, message = BAD_LISTS[case]
    api.answer_next("connections", reply)

    with pytest.raises(IsiError) as refused:
        isi_connections_refresh(integration=created.integration, actor="test")

    assert str(refused.value) == f"POST {api.base_url}/api/v1/connections/list: {message}"
    assert refused.value.status == reply.status
    assert _stored() == before
    failed = LedgerEvent.objects.get(kind="isi.connections_refresh_failed")
    assert failed.data["error"] == message
    assert LedgerEvent.objects.filter(kind="isi.connections_refreshed").count() == 1


def test_a_connection_list_answered_410_disables_the_integration_and_alerts(
    broker, api: IsiSimulator
) -> None:
    """The delivery policy's 410, on the first call the broker's API gets in a cycle: the
    integration is gone, not failing for now."""
    created = isi_integration_created(broker, api)
    api.answer_next("connections", Reply(410), Reply(410))

    for _ in range(2):  # disabled, and alerted, once
        with pytest.raises(IsiError, match=r"connections/list: HTTP 410$"):
            isi_connections_refresh(integration=created.integration, actor="test")

    integration = Integration.objects.get(pk=created.integration.pk)
    assert not integration.enabled
    assert integration.disabled_reason.startswith(
        f"410 Gone from {api.base_url}/api/v1/connections/list at "
    )
    (disabled,) = LedgerEvent.objects.filter(kind="integration.disabled")
    assert disabled.subject == str(integration.uuid)
    assert disabled.data["alert"] is True and disabled.data["by"] == "its connection list"
    assert ProcrastinateJob.objects.filter(task_name=enqueue.EVALUATE_ALERTS).exists()
    assert LedgerEvent.objects.filter(kind="isi.connections_refresh_failed").count() == 2


def test_creating_with_an_api_that_does_not_answer_still_creates_it_and_says_why(
    broker, api: IsiSimulator
) -> None:
    api.answer_next("connections", Reply(503))

    created = isi_integration_created(broker, api)

    assert Integration.objects.filter(pk=created.integration.pk).exists()
    assert created.connections == []
    assert created.connections_error.endswith("/api/v1/connections/list: HTTP 503")


# -- OAuth ----------------------------------------------------------------------------------


def test_the_token_is_cached_until_shortly_before_it_expires(broker, api: IsiSimulator) -> None:
    created = isi_integration_created(broker, api)
    integration = Integration.objects.get(pk=created.integration.pk)
    issued = integration.access_token
    expires_at = integration.access_token_expires_at
    assert expires_at is not None

    isi_connections_refresh(integration=integration, actor="test")
    assert api.tokens_issued == 1
    assert api.on("connections")[-1].headers["Authorization"] == f"Bearer {issued}"

    # 3600 s issued, used until a minute before.
    later = expires_at + dt.timedelta(seconds=1)
    assert expires_at - timezone.now() <= dt.timedelta(seconds=3540)
    assert isi_access_token(integration=integration, now=later) != issued
    assert api.tokens_issued == 2


def test_a_stale_token_is_refreshed_once_on_a_401(broker, api: IsiSimulator) -> None:
    created = isi_integration_created(broker, api)
    stale = Integration.objects.get(pk=created.integration.pk).access_token
    api.revoke_tokens()  # the broker no longer accepts it, though it has not expired

    refreshed = isi_connections_refresh(integration=created.integration, actor="test")

    assert refreshed.status == 200
    answers = [r.headers["Authorization"] for r in api.on("connections")[1:]]
    assert answers[0] == f"Bearer {stale}"
    assert answers[1] != answers[0]
    assert api.tokens_issued == 2
    assert Integration.objects.get(pk=created.integration.pk).access_token != stale


def test_a_401_to_a_fresh_token_too_is_a_failure(broker, api: IsiSimulator) -> None:
    created = isi_integration_created(broker, api)
    api.revoke_tokens()
    api.answer_next("connections", Reply(401), Reply(401))

    with pytest.raises(IsiError, match="refused a freshly issued access token too"):
        isi_connections_refresh(integration=created.integration, actor="test")

    assert api.tokens_issued == 2  # one refresh, not more
    assert len(api.on("connections")) == 3


def test_a_401_to_a_static_token_is_not_retried(broker, api: IsiSimulator) -> None:
    created = isi_integration_created(broker, api, oauth=False)
    api.token = "rotated-by-the-broker"

    with pytest.raises(IsiError, match="the broker refused the bearer token"):
        isi_connections_refresh(integration=created.integration, actor="test")

    assert len(api.on("connections")) == 2
    assert api.on("token") == []


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(503), ": HTTP 503"),
        (Reply(401, b'{"error": "invalid_client"}'), ": HTTP 401 (invalid_client)"),
        (Reply(200, b'{"token_type": "Bearer"}'), " answered without an access_token"),
        (Reply(200, b"not json"), " answered HTTP 200, but its answer is not JSON"),
        (
            Reply(200, b'{"access_token": "x", "token_type": "mac"}'),
            " issued a 'mac' token; a Bearer token is needed",
        ),
        # The endpoint's own text, not a token type's name: it may quote the secret sent.
        (
            Reply(200, b'{"access_token": "x", "token_type": "client-s3cret"}'),
            " issued another kind of token; a Bearer token is needed",
        ),
        (
            Reply(200, b'{"access_token": "x", "token_type": "Bearer Y2xpZW50LXMzY3JldA=="}'),
            " issued another kind of token; a Bearer token is needed",
        ),
    ],
)
def test_a_token_endpoint_that_fails_stops_the_call_before_the_api(
    broker, api: IsiSimulator, reply: Reply, message: str
) -> None:
    api.answer_next("token", reply)

    created = isi_integration_created(broker, api)

    assert created.connections_error == (
        f"POST {api.base_url}/api/v1/connections/list: "
        f"no answer (OAuth token endpoint {api.token_url}{message})"
    )
    assert api.on("connections") == []  # nothing reached the broker's API
    assert IsiConnection.objects.count() == 0


@pytest.mark.parametrize(("sent", "kept"), [("3600", 3600), ("²", None), (" 60", None)])
def test_a_token_lifetime_sent_as_text_is_read_from_ascii_digits_only(
    api: IsiSimulator, settings: Any, sent: str, kept: int | None
) -> None:
    # "²".isdigit() holds, yet int("²") raises: that was a traceback in every pull.
    answer = json.dumps({"access_token": "t", "token_type": "Bearer", "expires_in": sent})
    api.answer_next("token", Reply(200, answer.encode()))

    token = oauth_token_fetch(
        token_url=api.token_url, client_id="id", client_secret="s", allow_private=True
    )

    assert token.expires_in == kept


def test_a_token_endpoint_that_is_down_is_asked_again_only_after_a_while(
    broker, api: IsiSimulator
) -> None:
    api.answer_next("token", Reply(503))
    created = isi_integration_created(broker, api)
    assert created.connections_error

    with pytest.raises(IsiError, match="HTTP 503"):  # a whole batch of deliveries, say
        isi_access_token(integration=created.integration)
    assert len(api.on("token")) == 1

    later = timezone.now() + dt.timedelta(seconds=isi_tokens.TOKEN_FAILURE_HOLD + 1)
    assert isi_access_token(integration=created.integration, now=later).startswith("tok-")
    assert len(api.on("token")) == 2


# -- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"token": "t", "token_url": "https://auth.example/token"}, "auth"),
        ({}, "auth"),
        ({"token_url": "https://auth.example/token", "client_id": "id"}, "client_secret"),
        ({"client_id": "id", "client_secret": "s"}, "token_url"),
        (
            {"token_url": "http://auth.example/token", "client_id": "i", "client_secret": "s"},
            "token_url",
        ),
        ({"token": "t", "base_url": "http://api.acme.example"}, "base_url"),
        ({"token": "t", "base_url": "ftp://api.acme.example"}, "base_url"),
        ({"token": "t", "name": " "}, "name"),
    ],
)
def test_bad_settings_are_refused_and_nothing_is_written(
    broker, settings: Any, fields: dict[str, str], error: str
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = False  # production: https only
    arguments: dict[str, Any] = {"name": "Acme API", "base_url": "https://api.acme.example"}
    arguments.update(fields)

    with pytest.raises(ValidationError) as refused:
        isi_integration_create(broker=broker, actor="test", **arguments)

    assert error in refused.value.message_dict
    assert not Integration.objects.exists()
    assert not LedgerEvent.objects.filter(kind="integration.created").exists()


BASE_URL_REFUSAL = "a base URL must end at its path: no query (?), fragment (#) or ; parameters"


@pytest.mark.parametrize(
    "extra", ["?tenant=7", "#v1", ";v=1", "?"], ids=["query", "fragment", "parameters", "empty"]
)
def test_a_base_url_the_api_paths_would_land_in_is_refused(
    broker, api: IsiSimulator, extra: str
) -> None:
    """The DROP endpoints are appended to the base URL: after a query or a fragment they
    would be part of it, and every call would go to the base URL itself."""
    created = isi_integration_created(broker, api)
    base_url = f"{api.base_url}/isi{extra}"

    with pytest.raises(ValidationError) as refused:
        isi_integration_create(
            broker=broker, name="Acme API 2", base_url=base_url, token="t", actor="test"
        )
    assert refused.value.message_dict == {"base_url": [BASE_URL_REFUSAL]}

    with pytest.raises(ValidationError) as refused:
        isi_integration_update(
            integration=created.integration, actor="test", base_url=base_url, auth="token",
            token="t",
        )  # fmt: skip
    assert refused.value.message_dict == {"base_url": [BASE_URL_REFUSAL]}

    assert list(Integration.objects.values_list("base_url", flat=True)) == [api.base_url]
    assert not LedgerEvent.objects.filter(kind="integration.updated").exists()


def test_changing_credentials_drops_the_cached_token_and_the_ledger_keeps_no_secret(
    broker, api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, api)

    updated = isi_integration_update(
        integration=created.integration, actor="test", auth="token", token="new-static"
    )

    assert (updated.auth, updated.token, updated.client_secret) == ("token", "new-static", "")
    assert (updated.access_token, updated.access_token_expires_at) == ("", None)
    event = LedgerEvent.objects.get(kind="integration.updated")
    assert event.data["changes"] == {
        "auth": {"from": "oauth", "to": "token"},
        "token": {"changed": True},
        "token_url": {"from": created.integration.token_url, "to": ""},
        "client_id": {"from": created.integration.client_id, "to": ""},
        "client_secret": {"cleared": True},
    }
    assert "new-static" not in json.dumps(event.data)


# -- requests that waited for a target ------------------------------------------------------


def test_requests_matched_before_any_target_go_to_every_connection_taking_part(
    broker, api: IsiSimulator
) -> None:
    waiting = DeletionRequestFactory.create(
        work_item__cycle__broker=broker, state=RequestState.PENDING
    )

    created = isi_integration_created(broker, api)

    requests = list(DeletionRequest.objects.order_by("pk"))
    assert len(requests) == 2
    assert requests[0].pk == waiting.pk  # the waiting row itself takes the first connection
    assert {str(r.isi_connection.uuid) for r in requests if r.isi_connection} == {
        CONNECTION_A,
        CONNECTION_B,
    }
    for request in requests:
        assert request.integration == created.integration
        assert request.state == RequestState.QUEUED
        assert re.fullmatch(r"[0-9a-f]{64}", request.results_token or "")
        assert request.work_item_id == waiting.work_item_id
    assert requests[0].results_token != requests[1].results_token
    (job,) = ProcrastinateJob.objects.filter(
        task_name="integrations.tasks.deliver_deletion_requests"
    )
    assert job.args == {"request_ids": [r.pk for r in requests]}
    event = LedgerEvent.objects.get(kind="isi.connections_refreshed")
    assert event.data["pending_requests_queued"] == 2


@pytest.mark.parametrize("token", ["tok\u2019en", "tok\u2026", "tok\nen"])
def test_a_static_token_a_header_cannot_carry_is_refused_before_anything_is_written(
    broker, api: IsiSimulator, token: str
) -> None:
    """A pasted typographic character ("’", "…") passed, and every call to the API then
    raised out of http.client: the connection list (the staff action), and every delivery
    batch of the broker (undone after its calls were answered, its job failing for ever)."""
    with pytest.raises(ValidationError) as refused:
        isi_integration_create(
            broker=broker, name="Acme API", base_url=api.base_url, token=token, actor="test"
        )

    assert list(refused.value.message_dict) == ["token"]
    assert token.strip() not in str(refused.value)  # a credential is never echoed
    assert api.paths == []
    assert not Integration.objects.exists()


@pytest.mark.parametrize("expires_in", [10**12, 10**30, "1000000000000"])
def test_a_token_lifetime_beyond_the_calendar_is_a_long_one_not_a_crash(
    broker, expires_in: Any
) -> None:
    """``expires_in`` is the token endpoint's to choose: one past year 9999 overflowed the
    expiry, out of the staff action (the new integration's Webhook Secret, shown once, lost
    with it) and out of every delivery batch's message building."""
    with IsiSimulator(connections=broker_connections(), expires_in=expires_in) as oauth_api:
        created = isi_integration_created(broker, oauth_api)
        assert created.connections_error == ""
        stored = Integration.objects.get(pk=created.integration.pk)
        assert stored.access_token_expires_at is not None
        assert stored.access_token_expires_at < timezone.now() + dt.timedelta(days=366)


def test_a_connection_list_nested_too_deeply_is_a_listing_error_and_the_secret_is_shown(
    broker, api: IsiSimulator
) -> None:
    """RecursionError out of the listing made the staff action fail after the integration was
    created: its Webhook Secret, shown once, was lost with the traceback."""
    api.answer_next("connections", Reply(200, b'{"results": ' + b"[" * 5000 + b"]" * 5000 + b"}"))

    created = isi_integration_created(broker, api, oauth=False)

    assert created.webhook_secret
    assert created.connections_error.endswith("the connection list is nested too deeply")


def test_a_token_endpoints_error_nested_too_deeply_is_a_token_error(api: IsiSimulator) -> None:
    api.answer_next("token", Reply(400, b"[" * 5000 + b"]" * 5000))

    with pytest.raises(IsiError) as failed:
        oauth_token_fetch(
            token_url=api.token_url, client_id="id", client_secret="s", allow_private=True
        )

    assert str(failed.value) == f"OAuth token endpoint {api.token_url}: HTTP 400"


# -- credentials an answer echoes -----------------------------------------------------------


def test_a_connection_list_answer_echoing_the_static_token_is_kept_redacted_and_masked(
    broker, api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, api, oauth=False)
    echo = b'{"message": "Bearer static-t0ken is not valid for ann@example.com"}'
    api.answer_next("connections", Reply(401, echo))

    with pytest.raises(IsiError) as refused:
        isi_connections_refresh(integration=created.integration, actor="test")

    assert refused.value.answer == '{"message": "Bearer [redacted] is not valid for <email>"}'
    kept = str(refused.value) + json.dumps(list(LedgerEvent.objects.values_list("data")))
    assert "static-t0ken" not in kept
    assert "ann@example.com" not in kept


def test_a_connection_list_answer_echoing_the_access_token_and_client_secret_is_redacted(
    broker, api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, api)
    access_token = Integration.objects.get(pk=created.integration.pk).access_token
    echo = {"message": f"Bearer {access_token} of client {api.client_secret} is not valid"}
    api.answer_next("connections", Reply(500, json.dumps(echo).encode()))

    with pytest.raises(IsiError) as refused:
        isi_connections_refresh(integration=created.integration, actor="test")

    answer = json.loads(refused.value.answer)
    assert answer == {"message": "Bearer [redacted] of client [redacted] is not valid"}
    kept = str(refused.value) + json.dumps(list(LedgerEvent.objects.values_list("data")))
    assert access_token not in kept
    assert api.client_secret not in kept


@pytest.mark.parametrize(
    "echoed",
    [
        "Ab3/xY9+kL0=",  # as written
        "Ab3\\/xY9+kL0=",  # PHP's json_encode
        "Ab3\\u002FxY9\\u002BkL0\\u003D",  # .NET's, any case
        "Ab3\\u002fxY9\\u002bkL0=",
    ],
)
def test_a_secret_echoed_in_any_json_escaping_is_redacted(echoed: str) -> None:
    answered = f'{{"error": "token {echoed} is not valid"}}'

    assert text_redacted(answered, ["Ab3/xY9+kL0=", ""]) == (
        '{"error": "token [redacted] is not valid"}'
    )


SECRET = "s3cret/of+the=client"
# Each form the secret is sent in: as it is, form-encoded, in the Basic header's Base64.
SECRET_SENT = (SECRET, quote_plus(SECRET), b64encode(f"id:{quote_plus(SECRET)}".encode()).decode())


@pytest.mark.parametrize("echoed", SECRET_SENT)
def test_a_token_endpoints_error_text_is_not_kept_in_any_form_of_the_secret(
    api: IsiSimulator, echoed: str
) -> None:
    said = {"error": f"invalid_client: client_secret {echoed} does not match"}
    api.answer_next("token", Reply(401, json.dumps(said).encode()))

    with pytest.raises(IsiError) as failed:
        oauth_token_fetch(
            token_url=api.token_url, client_id="id", client_secret=SECRET, allow_private=True
        )

    assert str(failed.value) == (
        f"OAuth token endpoint {api.token_url}: HTTP 401 ({ERROR_TEXT_NOT_SHOWN})"
    )


def test_a_token_endpoints_error_code_is_kept(api: IsiSimulator) -> None:
    api.answer_next("token", Reply(401, b'{"error": "invalid_client"}'))

    with pytest.raises(IsiError) as failed:
        oauth_token_fetch(
            token_url=api.token_url, client_id="id", client_secret=SECRET, allow_private=True
        )

    assert str(failed.value) == f"OAuth token endpoint {api.token_url}: HTTP 401 (invalid_client)"


def test_a_connections_refresh_failing_at_the_token_endpoint_logs_no_form_of_the_secret(
    broker, caplog: pytest.LogCaptureFixture
) -> None:
    with IsiSimulator(connections=broker_connections(), client_secret=SECRET) as oauth_api:
        isi_integration_created(broker, oauth_api)
        Integration.objects.update(access_token="", access_token_expires_at=None)
        isi_tokens._held.clear()
        basic = b64encode(f"{oauth_api.client_id}:{quote_plus(SECRET)}".encode()).decode()
        said = {"error": f"invalid_client: {SECRET} sent as {quote_plus(SECRET)} in {basic}"}
        oauth_api.answer_next("token", Reply(401, json.dumps(said).encode()))

        (failed,) = isi_connections_refresh_for_broker(broker=broker, actor="test")

    assert isinstance(failed, IsiError)
    kept = caplog.text + str(failed) + json.dumps(list(LedgerEvent.objects.values_list("data")))
    for form in (SECRET, quote_plus(SECRET), basic):
        assert form not in kept
    assert ERROR_TEXT_NOT_SHOWN in caplog.text
