"""ISI deletes and identifier retrievals through the shared delivery loop, to a real loopback
ISI API: the bodies of 2.6 with the bearer token, the acknowledgement (any 2xx in time),
the synchronous identifiers feeding the SaaS deletions, OAuth tokens (one
refresh on a 401), and every fault, each a failed attempt on the same policy as webhooks.

Failure cases share the success case's setup and change one thing.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import ssl
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
from django.db import connection
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.broker_simulator import Reply
from devtools.isi_simulator import IsiSimulator
from integrations import outbound_http
from integrations.dispatch.isi import ERROR_TEXT_NOT_SHOWN
from integrations.models import (
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    IsiConnection,
    LedgerEvent,
    RequestState,
    SaasDeletion,
)
from integrations.outbound_http import tls_context
from integrations.services.cycle import isi_tokens
from integrations.services.dispatch.deliveries import (
    deletion_requests_deliver,
    resolution_requests_deliver,
)
from integrations.services.staff.isi import CreatedIsiIntegration
from tests.builders import (
    CONNECTION_A,
    DeletionRequestFactory,
    ResolutionRequestFactory,
    SaasConnectionFactory,
    broker_connections,
    isi_integration_created,
)
from tests.tls import self_signed_certificate

pytestmark = pytest.mark.django_db

RESOLVED = {
    "email": [{"email": " Ann.Smith@Example.COM"}, {"email": "ann@old.example"}],
    "phone": [{"phone": "+14155559317"}],
}


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example"


@pytest.fixture
def api() -> Iterator[IsiSimulator]:
    with IsiSimulator(connections=broker_connections(), identifiers={"C-1": RESOLVED}) as running:
        yield running


@pytest.fixture
def created(broker: Any, api: IsiSimulator) -> CreatedIsiIntegration:
    return isi_integration_created(broker, api)


@pytest.fixture
def connection_a(created: CreatedIsiIntegration) -> IsiConnection:
    return created.integration.connections.get(uuid=CONNECTION_A)


def _jobs(task: str, pk: int) -> list[ProcrastinateJob]:
    return list(ProcrastinateJob.objects.filter(task_name=task, args__request_ids=[pk]))


def _cached_token(created: CreatedIsiIntegration) -> str:
    return Integration.objects.get(pk=created.integration.pk).access_token


# -- deletes --------------------------------------------------------------------------------


def test_a_delete_carries_the_body_of_2_6_with_the_bearer_token_and_processing_acknowledges(
    api: IsiSimulator, created: CreatedIsiIntegration, connection_a: IsiConnection
) -> None:
    request = DeletionRequestFactory.create(isi_connection=connection_a, remote_identifier="C-1")

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}

    (delete,) = api.on("delete")
    assert (delete.method, delete.path) == ("POST", f"/api/v1/privacy/drop/delete/{CONNECTION_A}")
    assert delete.json == {
        "request_uuid": str(request.request_uuid),
        "results_token": request.results_token,
        "callback_path": "/api/v1/drop/callbacks/isi",
        "drop_context": {
            "broker_id": "4821",
            "drop_session_id": "1",
            "hash_type": "email",
            "match_date": "2026-11-20",
        },
        "remote_identifier": "C-1",
        "remote_identifier_kind": "external_id",
    }
    assert delete.headers["Authorization"] == f"Bearer {_cached_token(created)}"
    assert delete.headers["Content-Type"] == "application/json"
    request.refresh_from_db()
    assert (request.state, request.attempts, request.last_error) == ("dispatched", 1, "")
    assert request.dispatched_at is not None
    (attempt,) = request.delivery_attempts.all()
    assert (attempt.status, attempt.error) == (200, "")
    assert attempt.url == f"{api.base_url}/api/v1/privacy/drop/delete/{CONNECTION_A}"
    assert json.loads(attempt.response_body) == {"status": "processing"}
    assert _cached_token(created) not in json.dumps(attempt.request_headers)
    assert LedgerEvent.objects.get(kind="deletion_request.delivered").data["status"] == 200


def _expired_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached token has expired, and this worker holds none (a fresh process)."""
    Integration.objects.update(access_token_expires_at=timezone.now() - dt.timedelta(seconds=1))
    monkeypatch.setattr(isi_tokens, "_held", {})


def test_the_token_is_fetched_once_for_many_deletes(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [
        DeletionRequestFactory.create(isi_connection=connection_a, remote_identifier=f"C-{i}")
        for i in range(5)
    ]
    _expired_everywhere(monkeypatch)

    counts = deletion_requests_deliver(request_ids=[r.pk for r in requests])

    assert counts == {"delivered": 5}
    assert api.tokens_issued == 2  # at creation, and once for the whole batch
    assert len({d.headers["Authorization"] for d in api.on("delete")}) == 1


def test_the_callback_path_keeps_the_public_urls_prefix(
    api: IsiSimulator, connection_a: IsiConnection, settings: Any
) -> None:
    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example/dropportal"
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    deletion_requests_deliver(request_ids=[request.pk])

    assert api.on("delete")[0].json["callback_path"] == "/dropportal/api/v1/drop/callbacks/isi"


ACKNOWLEDGEMENTS = {
    "processing": Reply(200, b'{"status": "processing"}'),
    "another status": Reply(200, b'{"status": "accepted"}'),
    "not JSON": Reply(200, b"OK"),
    "202": Reply(202, b""),
    "204": Reply(204),
}


@pytest.mark.parametrize("case", ACKNOWLEDGEMENTS, ids=list(ACKNOWLEDGEMENTS))
def test_any_2xx_in_time_acknowledges_a_delete(
    api: IsiSimulator, connection_a: IsiConnection, case: str
) -> None:
    api.answer_next("delete", ACKNOWLEDGEMENTS[case])
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}

    request.refresh_from_db()
    assert (request.state, request.attempts, request.last_error) == ("dispatched", 1, "")
    assert request.dispatched_at is not None
    (attempt,) = request.delivery_attempts.all()
    assert (attempt.status, attempt.error) == (ACKNOWLEDGEMENTS[case].status, "")


def test_a_delete_answer_keeps_the_requests_own_uuid_and_masks_any_other(
    api: IsiSimulator, connection_a: IsiConnection
) -> None:
    request = DeletionRequestFactory.create(isi_connection=connection_a)
    device = "38400000-8cf0-11bd-b23e-10b96e40000d"
    api.answer_next("delete", Reply(500, f"{request.request_uuid}: {device} locked".encode()))

    deletion_requests_deliver(request_ids=[request.pk])

    (attempt,) = request.delivery_attempts.all()
    assert attempt.response_body == f"{request.request_uuid}: <maid> locked"


@pytest.mark.parametrize("reply", [Reply(500, b"database down"), Reply(302), Reply(429)])
def test_a_delete_answered_otherwise_is_a_failed_attempt_retried(
    api: IsiSimulator, connection_a: IsiConnection, reply: Reply
) -> None:
    api.answer_next("delete", reply)
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert (request.state, request.attempts) == ("queued", 1)
    assert str(reply.status) in request.last_error
    assert request.next_attempt_at is not None
    (job,) = _jobs("integrations.tasks.deliver_deletion_requests", request.pk)
    assert job.scheduled_at == request.next_attempt_at
    failed = LedgerEvent.objects.get(kind="deletion_request.delivery_failed")
    assert failed.data["error"] == request.last_error


def test_a_410_disables_the_integration_as_for_webhooks(
    api: IsiSimulator, created: CreatedIsiIntegration, connection_a: IsiConnection
) -> None:
    api.answer_next("delete", Reply.gone())
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"gone": 1}

    integration = Integration.objects.get(pk=created.integration.pk)
    assert not integration.enabled
    assert integration.disabled_reason.startswith("410 Gone from ")
    assert LedgerEvent.objects.get(kind="integration.disabled").data["alert"] is True


def test_a_delete_answer_echoing_the_access_token_and_client_secret_is_kept_redacted(
    api: IsiSimulator, created: CreatedIsiIntegration, connection_a: IsiConnection
) -> None:
    token = _cached_token(created)
    echo = {"message": f"Bearer {token} of client {api.client_secret} is not valid"}
    api.answer_next("delete", Reply(500, json.dumps(echo).encode()))
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    (attempt,) = DeliveryAttempt.objects.all()
    assert json.loads(attempt.response_body) == {
        "message": "Bearer [redacted] of client [redacted] is not valid"
    }
    request.refresh_from_db()
    kept = (
        attempt.response_body
        + request.last_error
        + json.dumps(list(LedgerEvent.objects.values_list("data")))
    )
    assert token not in kept
    assert api.client_secret not in kept


SECRET = "s3cret/of+the=client"


@pytest.fixture
def secret_api() -> Iterator[IsiSimulator]:
    """A broker whose client secret form-encoding changes: each form it is sent in differs."""
    with IsiSimulator(connections=broker_connections(), client_secret=SECRET) as running:
        yield running


def _secret_sent(api: IsiSimulator) -> list[str]:
    basic = b64encode(f"{api.client_id}:{quote_plus(SECRET)}".encode()).decode()
    return [SECRET, quote_plus(SECRET), basic]


def test_a_delete_answer_echoing_the_client_secret_in_any_form_sent_is_kept_redacted(
    broker: Any, secret_api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, secret_api)
    forms = _secret_sent(secret_api)
    echo = {"message": " and ".join(forms)}
    secret_api.answer_next("delete", Reply(500, json.dumps(echo).encode()))
    request = DeletionRequestFactory.create(
        isi_connection=created.integration.connections.get(uuid=CONNECTION_A)
    )

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    (attempt,) = DeliveryAttempt.objects.all()
    assert json.loads(attempt.response_body) == {
        "message": "[redacted] and [redacted] and [redacted]"
    }


def test_a_token_endpoints_error_echoing_the_client_secret_is_kept_nowhere(
    broker: Any,
    secret_api: IsiSimulator,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    created = isi_integration_created(broker, secret_api)
    _expired_everywhere(monkeypatch)
    forms = _secret_sent(secret_api)
    said = {"error": f"invalid_client: client_secret {' or '.join(forms)} does not match"}
    secret_api.answer_next("token", Reply(401, json.dumps(said).encode()))
    request = DeletionRequestFactory.create(
        isi_connection=created.integration.connections.get(uuid=CONNECTION_A)
    )

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    (attempt,) = DeliveryAttempt.objects.all()
    assert request.last_error == (
        f"OAuth token endpoint {secret_api.token_url}: HTTP 401 ({ERROR_TEXT_NOT_SHOWN})"
    )
    kept = (
        request.last_error
        + attempt.error
        + attempt.response_body
        + caplog.text
        + json.dumps(list(LedgerEvent.objects.values_list("data")))
    )
    for form in forms:
        assert form not in kept


def test_a_delete_answer_echoing_the_static_token_is_kept_redacted(broker: Any) -> None:
    with IsiSimulator(connections=broker_connections(), token="static-t0ken") as static_api:
        created = isi_integration_created(broker, static_api, oauth=False)
        static_api.answer_next(
            "delete", Reply(401, b'{"message": "Bearer static-t0ken is not valid"}')
        )
        request = DeletionRequestFactory.create(
            isi_connection=created.integration.connections.get(uuid=CONNECTION_A)
        )

        assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    (attempt,) = DeliveryAttempt.objects.all()
    assert json.loads(attempt.response_body) == {"message": "Bearer [redacted] is not valid"}
    assert "static-t0ken" not in json.dumps(list(LedgerEvent.objects.values_list("data")))


# -- OAuth while delivering -----------------------------------------------------------------


def test_a_stale_token_is_refreshed_once_and_the_renewed_one_kept(
    api: IsiSimulator,
    created: CreatedIsiIntegration,
    connection_a: IsiConnection,
    django_capture_on_commit_callbacks: Any,
) -> None:
    stale = _cached_token(created)
    api.revoke_tokens()
    first, second = (
        DeletionRequestFactory.create(isi_connection=connection_a),
        DeletionRequestFactory.create(isi_connection=connection_a),
    )

    assert deletion_requests_deliver(request_ids=[first.pk]) == {"delivered": 1}

    tries = [d.headers["Authorization"] for d in api.on("delete")]
    assert tries[0] == f"Bearer {stale}"
    renewed = tries[1].removeprefix("Bearer ")
    assert renewed != stale
    assert api.tokens_issued == 2
    (attempt,) = DeliveryAttempt.objects.all()
    assert attempt.status == 200

    # Renewed on the sending thread, stored by the next delivery's batch once it commits.
    with django_capture_on_commit_callbacks(execute=True):
        assert deletion_requests_deliver(request_ids=[second.pk]) == {"delivered": 1}
    assert api.on("delete")[-1].headers["Authorization"] == f"Bearer {renewed}"
    assert _cached_token(created) == renewed
    assert api.tokens_issued == 2


def test_a_401_to_the_fresh_token_too_is_a_failed_attempt(
    api: IsiSimulator, connection_a: IsiConnection
) -> None:
    api.answer_next("delete", Reply(401), Reply(401))
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.last_error == "401: refused a freshly issued access token too"
    assert len(api.on("delete")) == 2
    assert api.tokens_issued == 2  # one refresh, not more


def test_a_token_endpoint_that_is_down_fails_the_attempts_before_any_delete(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _expired_everywhere(monkeypatch)
    api.answer_next("token", Reply(503))
    requests = [DeletionRequestFactory.create(isi_connection=connection_a) for _ in range(3)]

    assert deletion_requests_deliver(request_ids=[r.pk for r in requests]) == {"retry": 3}

    assert api.on("delete") == []
    assert len(api.on("token")) == 2  # at creation, then once for the batch
    for request in DeletionRequest.objects.all():
        assert request.last_error == f"OAuth token endpoint {api.token_url}: HTTP 503"
        (attempt,) = request.delivery_attempts.all()
        assert attempt.status is None
        assert _jobs("integrations.tasks.deliver_deletion_requests", request.pk)


def test_a_token_endpoint_that_does_not_answer_at_all_fails_the_attempt(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _expired_everywhere(monkeypatch)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        token_url = f"http://127.0.0.1:{closed.getsockname()[1]}/oauth/token"
    Integration.objects.update(token_url=token_url)
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.last_error == f"OAuth token endpoint {token_url}: connection refused"
    assert api.on("delete") == []


def test_a_token_endpoint_slower_than_the_calls_bound_fails_the_batch_cleanly_and_retries(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token endpoint that answers after the outbound bound (15 s; shortened here) is
    asked once for the batch, every delete fails its attempt with the timeout and is retried
    on the schedule, and nothing reaches the delete endpoint; its retry, the endpoint back,
    is delivered."""
    monkeypatch.setattr(outbound_http, "TOTAL_TIMEOUT", 0.5)
    _expired_everywhere(monkeypatch)
    api.answer_next("token", Reply.slow(30))
    requests = [DeletionRequestFactory.create(isi_connection=connection_a) for _ in range(3)]

    assert deletion_requests_deliver(request_ids=[r.pk for r in requests]) == {"retry": 3}

    assert api.on("delete") == []
    assert len(api.on("token")) == 2  # at creation, then once for the batch
    for request in DeletionRequest.objects.all():
        assert (request.state, request.attempts) == (RequestState.QUEUED, 1)
        assert request.last_error == f"OAuth token endpoint {api.token_url}: timed out after 0.5 s"
        assert request.next_attempt_at is not None
        assert _jobs("integrations.tasks.deliver_deletion_requests", request.pk)

    # The retry, in another process (nothing held), once the endpoint answers in time.
    monkeypatch.setattr(isi_tokens, "_held", {})
    DeletionRequest.objects.update(next_attempt_at=timezone.now())
    assert deletion_requests_deliver(request_ids=[r.pk for r in requests]) == {"delivered": 3}
    assert len(api.on("delete")) == 3


def test_a_token_renewal_slower_than_the_calls_bound_fails_the_attempt_and_retries(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal after a 401, made on a sender thread, is bounded the same way."""
    monkeypatch.setattr(outbound_http, "TOTAL_TIMEOUT", 0.5)
    api.revoke_tokens()
    api.answer_next("token", Reply.slow(30))
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert (request.state, request.attempts) == (RequestState.QUEUED, 1)
    assert request.last_error == f"OAuth token endpoint {api.token_url}: timed out after 0.5 s"
    assert len(api.on("delete")) == 1  # the stale token's call, refused; no second call
    assert _jobs("integrations.tasks.deliver_deletion_requests", request.pk)


def test_a_token_endpoints_query_is_kept_out_of_the_error(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error is kept on the request and shown to staff: the endpoint's query (a tenant
    key, say) is not, as no URL's query is anywhere else."""
    _expired_everywhere(monkeypatch)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        where = f"http://127.0.0.1:{closed.getsockname()[1]}/oauth/token"
    Integration.objects.update(token_url=f"{where}?tenant=acme&key=s3cr3t")
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    deletion_requests_deliver(request_ids=[request.pk])

    request.refresh_from_db()
    assert request.last_error == f"OAuth token endpoint {where}: connection refused"


# -- identifier retrieval -------------------------------------------------------------------


def test_identifiers_are_retrieved_synchronously_and_start_the_saas_deletions(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    mailer = SaasConnectionFactory.create(
        broker=broker, url="https://api.mailer.example/erase", identifier_categories=[]
    )
    sms = SaasConnectionFactory.create(
        broker=broker, url="https://sms.example/erase", name="SMS", identifier_categories=["phone"]
    )
    # Paused: its deletion waits, so its category is asked for too.
    ads = SaasConnectionFactory.create(
        broker=broker, url="https://ads.example", name="Ads", identifier_categories=["maid"],
        enabled=False,
    )  # fmt: skip
    SaasConnectionFactory.create(  # retired: gone for good
        broker=broker, url="https://old.example", name="Old", identifier_categories=["vin"],
        enabled=False, retired_at=timezone.now(), retired_reason="contract ended",
    )  # fmt: skip
    resolution = ResolutionRequestFactory.create(
        isi_connection=connection_a, remote_identifier="C-1"
    )

    assert resolution_requests_deliver(request_ids=[resolution.pk]) == {"delivered": 1}

    (asked,) = api.on("identifiers")
    assert asked.path == f"/api/v2/privacy/drop/identifiers/{CONNECTION_A}"
    assert asked.json == {
        "request_uuid": str(resolution.request_uuid),
        "remote_identifier": "C-1",
        "remote_identifier_kind": "external_id",
        "identifier_categories": ["email", "maid", "phone"],  # the SaaS connections' union
    }
    assert asked.headers["Authorization"].startswith("Bearer tok-")
    resolution.refresh_from_db()
    assert resolution.state == RequestState.COMPLETED
    assert json.loads(resolution.identifiers) == RESOLVED  # verbatim
    deletions = SaasDeletion.objects.filter(resolution=resolution)
    assert {d.saas_connection for d in deletions} == {mailer, sms, ads}
    assert {d.state for d in deletions} == {"queued"}
    kinds = list(
        LedgerEvent.objects.filter(subject=str(resolution.request_uuid))
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds == ["resolution_request.delivered", "resolution_request.outcome_recorded"]
    # The clear identifiers are kept encrypted only: not in attempts, not in the ledger.
    (attempt,) = resolution.delivery_attempts.all()
    assert json.loads(attempt.response_body) == {
        "identifiers": {
            "email": [{"email": "<22 characters>"}, {"email": "<15 characters>"}],
            "phone": [{"phone": "<12 characters>"}],
        }
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT identifiers FROM integrations_resolutionrequest")
        (stored,) = cursor.fetchone()
    everything = stored + json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))
    assert "Ann.Smith" not in everything and "4155559317" not in everything


def test_without_categories_email_is_asked(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    SaasConnectionFactory.create(
        broker=broker, url="https://api.mailer.example/erase", identifier_categories=[]
    )
    resolution = ResolutionRequestFactory.create(isi_connection=connection_a)

    resolution_requests_deliver(request_ids=[resolution.pk])

    assert api.on("identifiers")[0].json["identifier_categories"] == ["email"]


def test_an_identifiers_answer_keyed_by_identifiers_is_kept_and_ledgered_masked(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    SaasConnectionFactory.create(
        broker=broker, url="https://sms.example/erase", identifier_categories=["phone"]
    )
    answer = {
        "identifiers": {
            "phone": [{"phone": "+14155559317"}],
            "ann@example.com": [{"ann@example.com": "x"}, {"ann@example.com": "y"}],
        },
        "carl@example.com": True,
    }
    api.answer_next("identifiers", Reply(200, json.dumps(answer).encode()))
    resolution = ResolutionRequestFactory.create(isi_connection=connection_a)

    assert resolution_requests_deliver(request_ids=[resolution.pk]) == {"delivered": 1}

    (attempt,) = resolution.delivery_attempts.all()
    assert json.loads(attempt.response_body) == {
        "identifiers": {
            "phone": [{"phone": "<12 characters>"}],
            "<key of 15 characters>": [
                {"<key of 15 characters>": "<1 characters>"},
                {"<key of 15 characters>": "<1 characters>"},
            ],
        },
        "<key of 16 characters>": True,
    }
    event = LedgerEvent.objects.get(kind="resolution_request.outcome_recorded")
    assert event.data["identifiers"] == {"phone": 1, "<key of 15 characters>": 2}
    kept = attempt.response_body + json.dumps(list(LedgerEvent.objects.values_list("data")))
    assert "example.com" not in kept


def test_identifiers_answered_as_numbers_are_kept_only_by_their_length(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    """A phone, ZIP code or date of birth sent as a JSON number is the wrong shape (retried),
    and each attempt keeps the number's length, never its digits."""
    SaasConnectionFactory.create(
        broker=broker, url="https://sms.example/erase", identifier_categories=["phone", "zip"]
    )
    answer = {
        "identifiers": {"phone": [{"phone": 14155559317}], "zip": [{"zip": 94107, "dob": 1.98e7}]}
    }
    api.answer_next("identifiers", Reply(200, json.dumps(answer).encode()))
    resolution = ResolutionRequestFactory.create(isi_connection=connection_a)

    assert resolution_requests_deliver(request_ids=[resolution.pk]) == {"retry": 1}

    (attempt,) = resolution.delivery_attempts.all()
    assert json.loads(attempt.response_body) == {
        "identifiers": {
            "phone": [{"phone": "<number of 11 characters>"}],
            "zip": [{"zip": "<number of 5 characters>", "dob": "<number of 10 characters>"}],
        }
    }
    kept = attempt.response_body + json.dumps(list(LedgerEvent.objects.values_list("data")))
    for digits in ("4155559317", "94107", "19800000"):
        # On their own: not by chance inside a request's UUID or a hash of the ledger's data.
        assert not re.search(rf"(?<![0-9A-Za-z]){digits}(?![0-9A-Za-z])", kept), digits


@pytest.mark.parametrize("key", ["ann@example.com", "4155559317"])
def test_a_wrong_shape_keyed_by_an_identifier_is_named_by_its_length(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection, key: str
) -> None:
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    answer = json.dumps({"identifiers": {key: [{"email": 5}]}}).encode()
    api.answer_next("identifiers", Reply(200, answer))
    resolution = ResolutionRequestFactory.create(isi_connection=connection_a)

    assert resolution_requests_deliver(request_ids=[resolution.pk]) == {"retry": 1}

    (attempt,) = resolution.delivery_attempts.all()
    masked = f"<key of {len(key)} characters>"  # the category, and its missing key
    error = f"identifiers have the wrong shape: {masked}[0].{masked}: This field is required."
    assert attempt.error == error
    resolution.refresh_from_db()
    assert resolution.last_error == f"200: {error}"
    kept = json.dumps(list(LedgerEvent.objects.values_list("data"))) + attempt.response_body
    assert key not in kept


WRONG_SHAPES: dict[str, tuple[Reply, str]] = {
    "a string where an array is": (
        Reply(200, b'{"identifiers": {"email": "ann@example.com"}}'),
        'identifiers have the wrong shape: email: Expected a list of items but got type "str".',
    ),
    "a number where a string is": (
        Reply(200, b'{"identifiers": {"email": [{"email": 5}]}}'),
        "identifiers have the wrong shape: email[0].email: Not a valid string.",
    ),
    "an object without its category's key": (
        Reply(200, b'{"identifiers": {"email": [{"address": "ann@example.com"}]}}'),
        "identifiers have the wrong shape: email[0].email: This field is required.",
    ),
    "no identifiers": (
        Reply(200, b'{"ids": {"email": []}}'),
        "the identifiers answer is not a JSON object with 'identifiers'",
    ),
    "an array": (
        Reply(200, b"[]"),
        "the identifiers answer is not a JSON object with 'identifiers'",
    ),
    "not JSON": (Reply(200, b"<html>"), "the identifiers answer is not JSON"),
    "202": (Reply(202, b'{"identifiers": {}}'), "expected 200 with {identifiers}, got HTTP 202"),
    "a key PostgreSQL cannot store": (
        Reply(200, b'{"identifiers": {"email": [{"email": "ann@example.com", "\\ud800": "x"}]}}'),
        "the identifiers answer cannot be stored: "
        "a string holds an unpaired surrogate (\\ud800 to \\udfff)",
    ),
    "a value PostgreSQL cannot store": (
        Reply(200, b'{"identifiers": {"email": [{"email": "ann@example.com\\u0000"}]}}'),
        "the identifiers answer cannot be stored: a string holds a NUL character (\\u0000)",
    ),
}


@pytest.mark.parametrize("case", WRONG_SHAPES, ids=list(WRONG_SHAPES))
def test_an_identifiers_answer_of_the_wrong_shape_is_a_failed_attempt(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection, case: str
) -> None:
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    reply, error = WRONG_SHAPES[case]
    api.answer_next("identifiers", reply)
    resolution = ResolutionRequestFactory.create(isi_connection=connection_a)

    assert resolution_requests_deliver(request_ids=[resolution.pk]) == {"retry": 1}

    resolution.refresh_from_db()
    assert (resolution.state, resolution.identifiers, resolution.completed_at) == (
        "queued",
        "",
        None,
    )
    assert resolution.last_error == f"{reply.status}: {error}"
    assert not SaasDeletion.objects.exists()
    (attempt,) = resolution.delivery_attempts.all()
    assert attempt.error == error
    assert "ann@example.com" not in attempt.response_body
    assert _jobs("integrations.tasks.deliver_resolution_requests", resolution.pk)
    assert not LedgerEvent.objects.filter(kind="resolution_request.outcome_recorded").exists()


# -- TLS ------------------------------------------------------------------------------------


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> str | None:
    """Both ends of a TLS handshake in memory (no socket); the version agreed on."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(to_client, to_server, server_hostname="isi.broker.example")
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, end in (("client", client_end), ("server", server_end)):
            if not done[side]:
                try:
                    end.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        if all(done.values()):
            return client_end.version()
    return None


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
@pytest.mark.parametrize("broker_tls", ["TLSv1_1", "TLSv1_2"])
def test_the_context_of_every_isi_call_refuses_tls_below_1_2(
    tmp_path: Path, broker_tls: str
) -> None:
    cert, key = self_signed_certificate(tmp_path, "isi.broker.example")
    broker_api = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # a broker stuck on an old version
    broker_api.load_cert_chain(cert, key)
    broker_api.minimum_version = ssl.TLSVersion.TLSv1
    broker_api.maximum_version = ssl.TLSVersion[broker_tls]
    broker_api.set_ciphers("DEFAULT:@SECLEVEL=0")
    lenient = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # shows the broker does speak it
    lenient.minimum_version = ssl.TLSVersion.TLSv1
    lenient.set_ciphers("DEFAULT:@SECLEVEL=0")
    ours = tls_context()  # what outbound_http.deliver, and so every ISI call, uses
    for client in (lenient, ours):
        client.load_verify_locations(cafile=cert)

    assert _handshake(lenient, broker_api) == broker_tls.replace("_", ".")
    if broker_tls == "TLSv1_2":
        assert _handshake(ours, broker_api) == "TLSv1.2"
    else:
        with pytest.raises(ssl.SSLError, match=r"UNSUPPORTED_PROTOCOL|unsupported protocol"):
            _handshake(ours, broker_api)


def test_an_isi_token_endpoint_on_a_private_address_is_refused_in_production(
    api: IsiSimulator,
    connection_a: IsiConnection,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = False
    _expired_everywhere(monkeypatch)
    Integration.objects.update(
        token_url=f"https://127.0.0.1:{api.port}/oauth/token",
        base_url=f"https://127.0.0.1:{api.port}",
    )
    request = DeletionRequestFactory.create(isi_connection=connection_a)
    before = len(api.received)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.last_error == (
        f"OAuth token endpoint https://127.0.0.1:{api.port}/oauth/token: "
        "target address not allowed: 127.0.0.1 is loopback"
    )
    assert len(api.received) == before  # nothing left the service


@pytest.mark.parametrize("status", [400, 500])
def test_an_identifiers_error_echoing_what_was_asked_is_kept_masked(
    api: IsiSimulator, connection_a: IsiConnection, status: int
) -> None:
    echo = b'{"error": "no such customer", "email": "ann@example.com", "phone": "+14155559317"}'
    api.answer_next("identifiers", Reply(status, echo))
    resolution = ResolutionRequestFactory.create(isi_connection=connection_a)

    assert resolution_requests_deliver(request_ids=[resolution.pk]) == {"retry": 1}

    (attempt,) = resolution.delivery_attempts.all()
    assert attempt.status == status
    assert "ann@example.com" not in attempt.response_body
    assert "4155559317" not in attempt.response_body
    assert json.loads(attempt.response_body) == {
        "error": "<16 characters>",
        "email": "<15 characters>",
        "phone": "<12 characters>",
    }


def test_a_token_endpoints_error_is_kept_storable_with_the_attempts_it_fails(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error the token endpoint names (RFC 6749 section 5.2) is the broker's text, kept
    with every attempt of the batch: one PostgreSQL cannot store undid them all. Not an
    error code, it is not kept at all."""
    _expired_everywhere(monkeypatch)
    api.answer_next("token", Reply(400, b'{"error": "invalid_client\\u0000\\ud800"}'))
    requests = [
        DeletionRequestFactory.create(isi_connection=connection_a, remote_identifier=f"C-{i}")
        for i in range(2)
    ]

    assert deletion_requests_deliver(request_ids=[r.pk for r in requests]) == {"retry": 2}

    for request in DeletionRequest.objects.all():
        expected = f"OAuth token endpoint {api.token_url}: HTTP 400 ({ERROR_TEXT_NOT_SHOWN})"
        assert request.last_error == expected
        (attempt,) = request.delivery_attempts.all()
        assert attempt.error == expected
    events = LedgerEvent.objects.filter(kind="deletion_request.delivery_failed")
    assert events.count() == 2


def test_a_token_endpoints_error_naming_the_consumer_is_not_kept(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker's words in a token endpoint's error are not an OAuth error code: the
    failure's text, kept on the attempt, the request and in the ledger, says so instead of
    quoting them (they may name the consumer, or echo the client secret)."""
    _expired_everywhere(monkeypatch)
    api.answer_next("token", Reply(400, b'{"error": "no client for ann@example.com"}'))
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    expected = (
        f"OAuth token endpoint {api.token_url}: HTTP 400"
        " (its error text, not an OAuth error code, is not shown)"
    )
    assert request.last_error == expected
    (attempt,) = request.delivery_attempts.all()
    assert attempt.error == expected
    assert "ann@" not in attempt.response_body
    failed = LedgerEvent.objects.get(kind="deletion_request.delivery_failed")
    assert failed.data["error"] == expected


def test_an_unstorable_isi_answer_fails_its_own_attempt_not_the_batch(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    """Recording an answer runs in the batch's transaction: one that could not be stored
    undid every request of the batch, each called again by the job's retry."""
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    good = ResolutionRequestFactory.create(isi_connection=connection_a, remote_identifier="C-1")
    bad = ResolutionRequestFactory.create(isi_connection=connection_a, remote_identifier="C-2")
    api.answer_next(
        "identifiers",
        Reply(200, b'{"identifiers": {"email": [{"email": "ann@example.com"}]}}'),
        Reply(200, b'{"identifiers": {"email": [{"email": "bob@example.com", "\\ud800": "x"}]}}'),
    )

    counts = resolution_requests_deliver(request_ids=[good.pk, bad.pk], threads=1)

    assert counts == {"delivered": 1, "retry": 1}
    assert len(api.on("identifiers")) == 2
    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.state == RequestState.COMPLETED
    assert (bad.state, bad.attempts, bad.identifiers) == (RequestState.QUEUED, 1, "")
    assert DeliveryAttempt.objects.count() == 2
    assert SaasDeletion.objects.get().resolution_id == good.pk
    assert _jobs("integrations.tasks.deliver_resolution_requests", bad.pk)


def test_an_access_token_that_cannot_be_a_header_fails_the_attempts_not_the_batch(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An access token is visible ASCII (RFC 6749 appendix A.12): one with a character HTTP
    cannot carry ("€") raised out of the sending threads, which undid the whole batch (its
    calls to other targets already answered) and failed the job, whose retry called them all
    again, for ever."""
    _expired_everywhere(monkeypatch)
    api.answer_next("token", Reply(200, b'{"access_token": "tok-\\u20ac", "token_type": "Bearer"}'))
    requests = [
        DeletionRequestFactory.create(isi_connection=connection_a, remote_identifier=f"C-{i}")
        for i in range(2)
    ]

    assert deletion_requests_deliver(request_ids=[r.pk for r in requests]) == {"retry": 2}

    assert api.on("delete") == []
    for request in DeletionRequest.objects.all():
        assert request.last_error == (
            f"OAuth token endpoint {api.token_url} issued an access_token that is not "
            "visible ASCII (RFC 6749 appendix A.12)"
        )
        assert request.delivery_attempts.count() == 1
    assert "\u20ac" not in (Integration.objects.get().access_token or "")


def test_an_identifiers_answer_nested_too_deeply_fails_its_own_attempt_not_the_batch(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    """JSON nested past Python's recursion limit raised RecursionError out of the answer's
    check on the sending thread, undoing the whole batch, and its job's retry for ever."""
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    good = ResolutionRequestFactory.create(isi_connection=connection_a, remote_identifier="C-1")
    deep = ResolutionRequestFactory.create(isi_connection=connection_a, remote_identifier="C-2")
    nested = b'{"identifiers": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    api.answer_next(
        "identifiers",
        Reply(200, b'{"identifiers": {"email": [{"email": "ann@example.com"}]}}'),
        Reply(200, nested),
    )

    counts = resolution_requests_deliver(request_ids=[good.pk, deep.pk], threads=1)

    assert counts == {"delivered": 1, "retry": 1}
    deep.refresh_from_db()
    assert deep.last_error == "200: the identifiers answer is nested too deeply"
    (attempt,) = deep.delivery_attempts.all()
    assert attempt.response_body == f"[not kept: {len(nested)} bytes, nested too deeply]"
    good.refresh_from_db()
    assert good.state == RequestState.COMPLETED


def test_an_identifiers_answer_with_other_keys_of_any_type_is_kept_verbatim(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    answered = {"email": [{"email": "ann@example.com", "primary": True, "rank": 1}]}
    api.answer_next("identifiers", Reply(200, json.dumps({"identifiers": answered}).encode()))
    resolution = ResolutionRequestFactory.create(isi_connection=connection_a)

    assert resolution_requests_deliver(request_ids=[resolution.pk]) == {"delivered": 1}

    resolution.refresh_from_db()
    assert resolution.state == RequestState.COMPLETED
    assert json.loads(resolution.identifiers) == answered


@pytest.mark.parametrize("asked", ["9" * 400, "1" * 5000])
def test_a_retry_after_beyond_any_float_is_a_long_wait_not_a_crash(
    api: IsiSimulator, connection_a: IsiConnection, asked: str
) -> None:
    """``Retry-After`` is read on the sending thread: 400 digits overflowed float() and
    5,000 passed int()'s limit, raising out of the batch (undone, its job retried for ever)."""
    api.answer_next("delete", Reply(429, b"", headers={"Retry-After": asked}))
    request = DeletionRequestFactory.create(isi_connection=connection_a)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert request.next_attempt_at is not None
    assert request.last_error == "HTTP 429"


def test_an_identifiers_answer_naming_a_key_twice_is_a_failed_attempt(
    broker: Any, api: IsiSimulator, connection_a: IsiConnection
) -> None:
    """JSON leaves a key named twice to the parser, and Python keeps the last: the first
    category's identifiers were dropped without a word, and no SaaS deletion asked for
    them. The API refuses such a body from a broker; so is this answer."""
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    request = ResolutionRequestFactory.create(isi_connection=connection_a, remote_identifier="C-1")
    api.answer_next(
        "identifiers",
        Reply(
            200,
            b'{"identifiers": {"email": [{"email": "ann@example.com"}],'
            b' "email": [{"email": "bob@example.com"}]}}',
        ),
    )

    assert resolution_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.last_error == (
        "200: the identifiers answer names the same key twice, so which value is meant "
        "cannot be told"
    )
    assert not SaasDeletion.objects.exists()


def test_a_failures_text_keeps_the_isi_connections_uuid(
    api: IsiSimulator, connection_a: IsiConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A token endpoint of its own per connection: its path names the connection.
    _expired_everywhere(monkeypatch)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        token_url = f"http://127.0.0.1:{closed.getsockname()[1]}/oauth/{connection_a.uuid}"
    Integration.objects.update(token_url=token_url)
    request = DeletionRequestFactory.create(isi_connection=connection_a)
    resolution = ResolutionRequestFactory.create(
        isi_connection=connection_a, integration=connection_a.integration
    )

    deletion_requests_deliver(request_ids=[request.pk])
    resolution_requests_deliver(request_ids=[resolution.pk])

    request.refresh_from_db()
    resolution.refresh_from_db()
    said = f"OAuth token endpoint {token_url}: connection refused"
    assert (request.last_error, resolution.last_error) == (said, said)
    assert request.delivery_attempts.get().error == said
