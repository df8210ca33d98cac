"""Delivering deletion dispatches to a real loopback broker, and every fault on the way.

Each test runs ``deletion_requests_deliver`` the way the job does, against the
``BrokerSimulator`` (which checks signatures with the secret the integration was given), and
asserts what staff and the broker would see: the request's state, its recorded attempts,
the retry job, the ledger, and what arrived at the broker.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import time
from collections.abc import Iterator

import pytest
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.broker_simulator import BrokerSimulator, Reply
from integrations import outbound_http
from integrations.dispatch import signing
from integrations.dispatch.policy import MAX_ATTEMPTS
from integrations.dispatch.transport import Message
from integrations.dispatch.webhook import WebhookTransport
from integrations.models import (
    Broker,
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    LedgerEvent,
    RequestState,
)
from integrations.services.dispatch.deliveries import deletion_requests_deliver
from integrations.services.dispatch.delivery_loop import _failure_kept
from integrations.services.staff.integrations import CreatedIntegration, integration_enable
from tests.builders import (
    DeletionRequestFactory,
    ResolutionRequestFactory,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db

DELIVER_TASK = "integrations.tasks.deliver_deletion_requests"


@pytest.fixture(autouse=True)
def private_targets(settings) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example"


@pytest.fixture
def receiver() -> Iterator[BrokerSimulator]:
    with BrokerSimulator() as running:
        yield running


@pytest.fixture
def created(broker: Broker, receiver: BrokerSimulator) -> CreatedIntegration:
    created = webhook_integration_created(broker, receiver.url)
    receiver.secrets = [created.webhook_secret]  # the broker holds the secret it was given
    return created


@pytest.fixture
def integration(created: CreatedIntegration) -> Integration:
    return created.integration


def _retry_jobs(request: DeletionRequest) -> list[ProcrastinateJob]:
    return list(
        ProcrastinateJob.objects.filter(task_name=DELIVER_TASK, args__request_ids=[request.pk])
    )


def _events(kind: str) -> list[LedgerEvent]:
    return list(LedgerEvent.objects.filter(kind=kind).order_by("id"))


def _make_due(request: DeletionRequest) -> None:
    # Stands in for the retry job's time arriving; no test waits for real.
    DeletionRequest.objects.filter(pk=request.pk).update(
        next_attempt_at=timezone.now() - dt.timedelta(seconds=1)
    )


# -- delivered ------------------------------------------------------------------------------


def test_a_dispatch_carries_body_2_1_exactly_and_is_signed_with_the_integrations_secret(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    request = DeletionRequestFactory.create(integration=integration, remote_identifier="C-1")

    counts = deletion_requests_deliver(request_ids=[request.pk])

    assert counts == {"delivered": 1}
    (arrived,) = receiver.received
    assert arrived.method == "POST"
    assert arrived.signature_ok is True
    assert arrived.json == {
        "integration_name": "Acme CRM",
        "integration_kind": "webhook",
        "webhook_request_id": str(request.webhook_request_id),
        "request_type": "drop_deletion",
        "topic": "drop.deletion:create",
        "request_uuid": str(request.request_uuid),
        "integration_id": str(integration.uuid),
        "identifier_hash": "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=",
        "hash_type": "email",
        "drop_session_id": "1",
        "match_date": "2026-11-20",
        "broker_id": "4821",
        "mode": "test",
        "remote_identifier": "C-1",
        "webhook_callback_url": "https://portal.example/api/v1/drop/callbacks/deletion",
    }
    assert arrived.headers["X-Webhook-Id"] == str(request.webhook_request_id)
    assert arrived.headers["Content-Type"] == "application/json"
    assert arrived.headers["User-Agent"] == "dropportal"
    request.refresh_from_db()
    assert request.state == RequestState.DISPATCHED
    assert request.dispatched_at is not None
    assert request.attempts == 1
    (attempt,) = request.delivery_attempts.all()
    assert attempt.status == 200
    assert attempt.url == receiver.url
    assert attempt.request_headers["X-Webhook-Signature"] == arrived.headers["X-Webhook-Signature"]
    assert attempt.request_headers["X-Webhook-Timestamp"] == arrived.headers["X-Webhook-Timestamp"]
    (event,) = _events("deletion_request.delivered")
    assert event.subject == str(request.request_uuid)
    assert event.broker_id == "4821"
    assert event.data["status"] == 200
    assert not _retry_jobs(request)


def test_a_token_in_the_targets_query_goes_out_and_is_not_kept_in_the_attempt(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    created = webhook_integration_created(broker, receiver.url + "?token=s3cr3t-t0ken")
    receiver.secrets = [created.webhook_secret]
    request = DeletionRequestFactory.create(
        integration=created.integration, remote_identifier="C-1"
    )

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}

    (arrived,) = receiver.received
    assert "token=s3cr3t-t0ken" in arrived.path  # the broker's endpoint got what it asked for
    (attempt,) = request.delivery_attempts.all()
    assert attempt.url == receiver.url
    assert "s3cr3t" not in json.dumps([attempt.url, attempt.error, attempt.request_headers])


def test_a_token_in_the_targets_query_is_not_kept_when_it_answers_410(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    created = webhook_integration_created(broker, receiver.url + "?token=s3cr3t-t0ken")
    receiver.script(Reply.gone())
    request = DeletionRequestFactory.create(
        integration=created.integration, remote_identifier="C-1"
    )

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"gone": 1}

    created.integration.refresh_from_db()
    request.refresh_from_db()
    assert created.integration.disabled_reason.startswith(f"410 Gone from {receiver.url} at ")
    assert "s3cr3t" not in created.integration.disabled_reason + request.last_error


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        # The path it was asked, quoted: no URL for masking to find.
        (b"Cannot POST /?code=s3cr3t%2Bt0ken&v=2", "Cannot POST /?[redacted]"),
        (b'{"error": "unknown code s3cr3t+t0ken"}', '{"error": "unknown code [redacted]"}'),
        (b"bad code s3cr3t%2Bt0ken", "bad code [redacted]"),
        # Cut where the answer read ends, the token's start is not kept either.
        (b"x" * 4090 + b" s3cr3t%2Bt0ken", "x" * 4090 + " "),
    ],
)
def test_an_answer_quoting_the_token_in_the_targets_query_keeps_it_redacted(
    broker: Broker, receiver: BrokerSimulator, answer: bytes, kept: str
) -> None:
    created = webhook_integration_created(broker, receiver.url + "?code=s3cr3t%2Bt0ken&v=2")
    receiver.script(Reply(status=404, body=answer))
    request = DeletionRequestFactory.create(integration=created.integration)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    (attempt,) = request.delivery_attempts.all()
    assert attempt.response_body == kept


def test_remote_identifier_is_omitted_when_none_was_given(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    request = DeletionRequestFactory.create(integration=integration, remote_identifier="")

    deletion_requests_deliver(request_ids=[request.pk])

    assert "remote_identifier" not in receiver.received[0].json
    assert set(receiver.received[0].json) == {
        "integration_name", "integration_kind", "webhook_request_id", "request_type", "topic",
        "request_uuid", "integration_id", "identifier_hash", "hash_type", "drop_session_id",
        "match_date", "broker_id", "mode", "webhook_callback_url",
    }  # fmt: skip


def test_the_body_bytes_are_what_was_signed(
    integration: Integration, receiver: BrokerSimulator, created: CreatedIntegration
) -> None:
    request = DeletionRequestFactory.create(integration=integration)

    deletion_requests_deliver(request_ids=[request.pk])

    arrived = receiver.received[0]
    signing.verify(
        [created.webhook_secret],
        arrived.headers["X-Webhook-Timestamp"],
        arrived.headers["X-Webhook-Signature"],
        arrived.body,
    )
    with pytest.raises(signing.SignatureError):
        signing.verify(
            [signing.generate_webhook_secret()],
            arrived.headers["X-Webhook-Timestamp"],
            arrived.headers["X-Webhook-Signature"],
            arrived.body,
        )


# -- retried --------------------------------------------------------------------------------


def test_a_500_is_retried_with_the_same_webhook_request_id_and_a_fresh_signature(
    integration: Integration, receiver: BrokerSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = int(time.time())
    clock = iter([start, start + 7])  # the second attempt is signed 7 s later
    real_signed_headers = signing.signed_headers
    monkeypatch.setattr(
        signing,
        "signed_headers",
        lambda secret, body, now=None: real_signed_headers(secret, body, now=next(clock)),
    )
    receiver.script(Reply(status=500, body=b"database down"))
    request = DeletionRequestFactory.create(integration=integration)
    before = timezone.now()

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert request.attempts == 1
    assert request.last_error == "HTTP 500"
    assert request.next_attempt_at is not None
    wait = (request.next_attempt_at - before).total_seconds()
    assert 4 <= wait <= 6.5  # 5 s ± 20 %
    (job,) = _retry_jobs(request)
    assert job.scheduled_at == request.next_attempt_at  # the job fires when it is due
    (attempt,) = request.delivery_attempts.all()
    assert (attempt.status, attempt.response_body) == (500, "database down")
    (event,) = _events("deletion_request.delivery_failed")
    assert event.data["next_attempt_at"] == request.next_attempt_at.isoformat()

    # The retry job running early (a duplicate) does nothing: not due yet.
    assert deletion_requests_deliver(request_ids=[request.pk]) == {"skipped": 1}
    assert len(receiver.received) == 1

    _make_due(request)
    assert deletion_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}
    first, second = receiver.received
    assert first.headers["X-Webhook-Id"] == second.headers["X-Webhook-Id"]
    assert first.json["webhook_request_id"] == second.json["webhook_request_id"]
    assert first.headers["X-Webhook-Timestamp"] == str(start)
    assert second.headers["X-Webhook-Timestamp"] == str(start + 7)
    assert first.signature_ok and second.signature_ok
    assert first.headers["X-Webhook-Signature"] != second.headers["X-Webhook-Signature"]
    request.refresh_from_db()
    assert (request.state, request.attempts, request.last_error) == ("dispatched", 2, "")
    assert [a.number for a in request.delivery_attempts.order_by("number")] == [1, 2]


def test_receiver_down_is_retried(broker: Broker) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    integration = webhook_integration_created(
        broker, f"http://127.0.0.1:{closed_port}/hook"
    ).integration
    request = DeletionRequestFactory.create(integration=integration)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert request.last_error == "connection refused"
    attempt = request.delivery_attempts.get()
    assert attempt.status is None
    assert attempt.error == "connection refused"
    assert len(_retry_jobs(request)) == 1


def test_a_receiver_slower_than_the_timeout_is_retried(
    integration: Integration, receiver: BrokerSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbound_http, "TOTAL_TIMEOUT", 0.3)
    receiver.script(Reply.slow(3.0))
    request = DeletionRequestFactory.create(integration=integration)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    request.refresh_from_db()
    assert request.last_error == "timed out after 0.3 s"
    assert request.state == RequestState.QUEUED
    assert len(_retry_jobs(request)) == 1


def test_429_retry_after_is_honoured(integration: Integration, receiver: BrokerSimulator) -> None:
    receiver.script(Reply.rate_limited(retry_after="120"))
    request = DeletionRequestFactory.create(integration=integration)
    before = timezone.now()

    deletion_requests_deliver(request_ids=[request.pk])

    request.refresh_from_db()
    assert request.next_attempt_at is not None
    wait = (request.next_attempt_at - before).total_seconds()
    assert 119 <= wait <= 125  # the broker asked for 120 s, longer than the 5 s schedule
    assert request.last_error == "HTTP 429"


def test_a_redirect_is_not_followed_and_is_retried(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    receiver.script(Reply.redirect(location=receiver.base_url + "/elsewhere"))
    request = DeletionRequestFactory.create(integration=integration)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    assert len(receiver.received) == 1  # nothing went to the Location
    request.refresh_from_db()
    assert request.last_error == "301: redirect not followed (301)"
    assert request.state == RequestState.QUEUED


def test_after_the_last_attempt_the_request_is_undeliverable(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    receiver.script(500)
    request = DeletionRequestFactory.create(integration=integration, attempts=MAX_ATTEMPTS - 1)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"undeliverable": 1}

    request.refresh_from_db()
    assert request.state == RequestState.UNDELIVERABLE
    assert request.attempts == MAX_ATTEMPTS
    assert request.next_attempt_at is None
    assert not _retry_jobs(request)
    (event,) = _events("deletion_request.undeliverable")
    assert event.data["attempt"] == MAX_ATTEMPTS


# -- 410 and disabled integrations ----------------------------------------------------------


def test_410_disables_the_integration_alerts_staff_and_holds_the_rest(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    receiver.script(Reply.gone())
    first = DeletionRequestFactory.create(integration=integration, remote_identifier="C-1")
    second = DeletionRequestFactory.create(integration=integration, remote_identifier="C-2")

    assert deletion_requests_deliver(request_ids=[first.pk]) == {"gone": 1}
    assert deletion_requests_deliver(request_ids=[second.pk]) == {"skipped": 1}

    assert len(receiver.received) == 1  # nothing after the 410
    integration.refresh_from_db()
    assert integration.enabled is False
    assert integration.disabled_reason.startswith(f"410 Gone from {receiver.url}")
    # Staff read the reason in the admin: its time is in DROP's zone, like the pages'.
    assert re.search(r" at \d{4}-\d\d-\d\d \d\d:\d\d P[SD]T$", integration.disabled_reason)
    (alert,) = _events("integration.disabled")
    assert alert.subject == str(integration.uuid)
    assert alert.data["alert"] is True
    for request in (first, second):
        request.refresh_from_db()
        assert request.state == RequestState.QUEUED  # held, not lost
    assert not _retry_jobs(first)

    # Enabling it again queues both; they are delivered.
    assert integration_enable(integration=integration, actor="staff:ann") == 2
    jobs = ProcrastinateJob.objects.filter(task_name=DELIVER_TASK)
    assert sorted(jobs.get().args["request_ids"]) == sorted([first.pk, second.pk])
    assert deletion_requests_deliver(request_ids=[first.pk, second.pk]) == {"delivered": 2}
    assert LedgerEvent.objects.get(kind="integration.enabled").data["deletion_requests_queued"] == 2


def test_a_410_queues_an_alert_evaluation_with_the_disabling(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    evaluations = ProcrastinateJob.objects.filter(task_name="integrations.tasks.evaluate_alerts")
    deletion_requests_deliver(
        request_ids=[DeletionRequestFactory.create(integration=integration).pk]
    )
    assert not evaluations.exists()  # a delivery alerts nobody

    receiver.script(Reply.gone())
    assert deletion_requests_deliver(
        request_ids=[DeletionRequestFactory.create(integration=integration).pk]
    ) == {"gone": 1}

    assert evaluations.get().status == "todo"  # staff hear of it now, not in 5 minutes


def test_a_410_to_calls_already_in_flight_alerts_staff_once(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    receiver.default_reply = Reply.gone()
    requests = [
        DeletionRequestFactory.create(integration=integration, remote_identifier=f"C-{i}")
        for i in range(3)
    ]

    counts = deletion_requests_deliver(request_ids=[r.pk for r in requests])

    assert counts == {"gone": 3}
    assert len(_events("integration.disabled")) == 1
    assert {r.state for r in DeletionRequest.objects.all()} == {RequestState.QUEUED}


def test_nothing_is_delivered_to_a_disabled_integration(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    Integration.objects.filter(pk=integration.pk).update(enabled=False)
    request = DeletionRequestFactory.create(integration=integration)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"skipped": 1}

    assert receiver.received == []
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert not DeliveryAttempt.objects.exists()


@pytest.mark.parametrize(
    "state",
    [RequestState.DISPATCHED, RequestState.COMPLETED, RequestState.CANCELLED, RequestState.PENDING],
)
def test_what_is_no_longer_queued_is_never_delivered_again(
    integration: Integration, receiver: BrokerSimulator, state: str
) -> None:
    request = DeletionRequestFactory.create(integration=integration, state=state)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"skipped": 1}

    assert receiver.received == []
    assert not DeliveryAttempt.objects.exists()


def test_an_unexpected_error_fails_the_job_after_trying_every_request(
    integration: Integration, receiver: BrokerSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = DeletionRequestFactory.create(integration=integration, remote_identifier="C-1")
    fine = DeletionRequestFactory.create(integration=integration, remote_identifier="C-2")
    real = WebhookTransport.deletion_message

    def build(transport: WebhookTransport, request: DeletionRequest) -> Message:
        if request.pk == broken.pk:
            raise RuntimeError("secret unreadable")
        return real(transport, request)

    monkeypatch.setattr(WebhookTransport, "deletion_message", build)

    with pytest.raises(RuntimeError, match="secret unreadable"):
        deletion_requests_deliver(request_ids=[broken.pk, fine.pk])

    fine.refresh_from_db()
    assert fine.state == RequestState.DISPATCHED
    broken.refresh_from_db()
    assert broken.state == RequestState.QUEUED  # the job's retry will deliver it
    assert [r.json["request_uuid"] for r in receiver.received] == [str(fine.request_uuid)]


def test_attempt_records_keep_only_the_first_4_kib_of_the_answer(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    receiver.script(Reply(status=202, body=b"x" * 10_000))
    request = DeletionRequestFactory.create(integration=integration)

    deletion_requests_deliver(request_ids=[request.pk])

    attempt = request.delivery_attempts.get()
    assert attempt.status == 202
    assert len(attempt.response_body) == 4096
    assert json.loads(json.dumps(attempt.request_headers))["X-Webhook-Id"] == str(
        request.webhook_request_id
    )


def test_an_answer_naming_the_consumer_is_kept_with_the_identifiers_masked(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    """The answer is kept to tell staff why a call failed; a broker's error may name the
    consumer, as a callback's error_message may."""
    receiver.script(Reply(status=500, body=b"cannot delete Ann.Smith@Example.com: locked"))
    request = DeletionRequestFactory.create(integration=integration)

    deletion_requests_deliver(request_ids=[request.pk])

    attempt = request.delivery_attempts.get()
    assert (attempt.status, attempt.response_body) == (500, "cannot delete <email>: locked")


def test_an_answer_keeps_the_requests_own_uuids_and_masks_any_other(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    request = DeletionRequestFactory.create(integration=integration)
    answer = (
        f"request {request.request_uuid} (webhook {request.webhook_request_id}):"
        " device 38400000-8cf0-11bd-b23e-10b96e40000d unknown"
    )
    receiver.script(Reply(status=500, body=answer.encode()))

    deletion_requests_deliver(request_ids=[request.pk])

    attempt = request.delivery_attempts.get()
    assert attempt.response_body == (
        f"request {request.request_uuid} (webhook {request.webhook_request_id}):"
        " device <maid> unknown"
    )


def test_a_binary_answer_is_kept_storable_and_the_batch_with_it(
    integration: Integration, receiver: BrokerSimulator
) -> None:
    """PostgreSQL's text holds no NUL: an answer with one was a database error that undid
    the whole batch, every request of which the job's retry then sent again."""
    first = DeletionRequestFactory.create(integration=integration, remote_identifier="C-1")
    second = DeletionRequestFactory.create(integration=integration, remote_identifier="C-2")
    receiver.script(Reply(200, b"ok"), Reply(200, b"\x00\x01\x02 binary"))

    counts = deletion_requests_deliver(request_ids=[first.pk, second.pk], threads=1)

    assert counts == {"delivered": 2}
    assert len(receiver.received) == 2
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {RequestState.DISPATCHED}
    assert sorted(DeliveryAttempt.objects.values_list("response_body", flat=True)) == [
        "ok",
        "\ufffd\x01\x02 binary",
    ]
    assert len(_events("deletion_request.delivered")) == 2


@pytest.mark.parametrize(
    ("query", "answer", "kept"),
    [
        # Words of the answer that are the query's values, but no credential.
        (
            "?format=json&verbose=true",
            b'{"accepted": true, "format": "json"}',
            '{"accepted": true, "format": "json"}',
        ),
        ("?code=abcd", b"bad code abcd", "bad code [redacted]"),
        (f"?id={'f' * 32}", f"unknown id {'f' * 32}".encode(), "unknown id [redacted]"),
    ],
)
def test_only_a_query_value_that_may_be_a_credential_is_redacted_from_an_answer(
    broker: Broker, receiver: BrokerSimulator, query: str, answer: bytes, kept: str
) -> None:
    created = webhook_integration_created(broker, receiver.url + query)
    receiver.script(Reply(status=404, body=answer))
    request = DeletionRequestFactory.create(integration=created.integration)

    assert deletion_requests_deliver(request_ids=[request.pk]) == {"retry": 1}

    (attempt,) = request.delivery_attempts.all()
    assert attempt.response_body == kept


def test_a_resolution_delivery_failure_keeps_its_own_request_uuid(
    integration: Integration,
) -> None:
    # Its answer is kept only by its shape, but a failure's text is kept as text.
    request = ResolutionRequestFactory.create(integration=integration)
    message = WebhookTransport().resolution_message(request)
    device = "38400000-8cf0-11bd-b23e-10b96e40000d"

    kept = _failure_kept(f"500: {request.request_uuid} locked by {device}", message)

    assert kept == f"500: {request.request_uuid} locked by <maid>"
