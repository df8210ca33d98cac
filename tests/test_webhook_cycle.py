"""The whole webhook cycle over real HTTP.

A DROP package is imported and matched; a real worker delivers the deletion dispatches and
identifier retrieval notifications to a loopback broker that checks every signature with the
secret it was given; the broker answers each with a signed PUT callback to the running
service, covering every outcome (deleted, not_found, opted_out, exempt, failed then deleted)
and every resolution answer (identifiers, opted_out, exempt); the resolved identifiers go to
a loopback SaaS and are purged once it took them. The work items end with their DROP codes,
the opt-out record holds the verbatim email, and the ledger tells it all and verifies.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from django.core.management import call_command

from devtools.broker_simulator import BrokerSimulator, ReceivedRequest, sign_callback
from devtools.drop_simulator import work_items
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    OptOutRecord,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
)
from integrations.services.keys import api_key_create
from integrations.services.ledger import ledger_seal, ledger_verify
from tests.builders import (
    consumer,
    drop_zip,
    run_worker,
    worker_jobs_emptied,
    write_zip,
)

pytestmark = pytest.mark.django_db(transaction=True)

OPTED_OUT_EMAIL = " Ann.Smith+Drop@Example.COM"
OUTCOMES = ["deleted", "not_found", "opted_out", "exempt", "failed"]


@pytest.fixture(autouse=True)
def empty_job_tables() -> Iterator[None]:
    yield from worker_jobs_emptied()


@pytest.fixture
def broker_system() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/drop/webhook") as running:
        yield running


@pytest.fixture
def saas_system() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/v1/erase") as running:
        yield running


class BrokerCallbacks:
    """The broker's side of the callbacks: signed with its secret, its API key as bearer."""

    def __init__(self, secret: str, key: str) -> None:
        self.secret, self.key = secret, key

    def put(self, notification: ReceivedRequest, body: dict[str, Any]) -> requests.Response:
        raw, headers = sign_callback(self.secret, body)
        headers["Authorization"] = f"Bearer {self.key}"
        url = notification.json["webhook_callback_url"]
        return requests.put(url, data=raw, headers=headers, timeout=10)

    def outcome(self, dispatch: ReceivedRequest, outcome: str, **extra: Any) -> requests.Response:
        body = {
            "schema_version": "1.0",
            "status": "completed",
            "request_uuid": dispatch.json["request_uuid"],
            "drop_outcome": outcome,
            **extra,
        }
        return self.put(dispatch, body)

    def resolved(self, notification: ReceivedRequest, **answer: Any) -> requests.Response:
        body = {"status": "completed", "results_token": notification.json["results_token"]}
        return self.put(notification, {**body, **answer})


def _staff_sets_up(broker: Broker, broker_url: str, saas_url: str) -> tuple[str, str]:
    out = io.StringIO()
    call_command(
        "integrations", "add", "webhook", "--broker", "4821", "--name", "Acme CRM",
        "--url", broker_url, "--json", stdout=out,
    )  # fmt: skip
    secret = json.loads(out.getvalue())["webhook_secret"]
    call_command(
        "saas", "add", "--broker", "4821", "--name", "Mailer", "--url", saas_url,
        "--token", "mailer-token", "--categories", "email", stdout=io.StringIO(),
    )  # fmt: skip
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    return secret, key


def test_the_whole_webhook_cycle(
    broker: Broker,
    broker_system: BrokerSimulator,
    saas_system: BrokerSimulator,
    live_server: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = live_server.url
    secret, key = _staff_sets_up(broker, broker_system.url, saas_system.url)
    broker_system.secrets = [secret]

    # One consumer per outcome, each matched by DROP's email list.
    items = list(work_items(len(OUTCOMES)))
    for outcome, (_, email_hash) in zip(OUTCOMES, items, strict=True):
        consumer(broker, f"C-{outcome}", email=email_hash)
    package = write_zip(tmp_path, drop_zip(broker, {"Email": items}))
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())

    run_worker(["dispatch"])

    notifications = broker_system.wait_for(2 * len(OUTCOMES))
    assert all(n.signature_ok for n in notifications), [n.signature_error for n in notifications]
    dispatches = {
        n.json["remote_identifier"].removeprefix("C-"): n
        for n in notifications
        if n.json["topic"] == "drop.deletion:create"
    }
    resolutions = {
        n.json["identifiers"]["external_id"][0]["external_id"].removeprefix("C-"): n
        for n in notifications
        if n.json["topic"] == "drop.resolution:create"
    }
    assert set(dispatches) == set(resolutions) == set(OUTCOMES)
    assert {urlsplit(n.json["webhook_callback_url"]).path for n in notifications} == {
        "/api/v1/drop/callbacks/deletion",
        "/api/v1/drop/callbacks/resolution",
    }
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {"dispatched"}

    # The broker processes each deletion and calls back.
    broker_side = BrokerCallbacks(secret, key)
    answers = [
        broker_side.outcome(dispatches["deleted"], "deleted"),
        broker_side.outcome(dispatches["not_found"], "not_found"),
        broker_side.outcome(
            dispatches["opted_out"],
            "opted_out",
            identifiers={"email": [{"email": OPTED_OUT_EMAIL}]},
        ),
        broker_side.outcome(dispatches["exempt"], "exempt"),
        broker_side.outcome(dispatches["failed"], "failed", error_message="CRM locked the record"),
    ]
    assert [a.status_code for a in answers] == [200] * 5
    failed = DeletionRequest.objects.get(remote_identifier="C-failed")
    assert (failed.state, failed.error_message) == ("failed", "CRM locked the record")
    assert WorkItem.objects.get(pk=failed.work_item_id).status_code is None  # not final

    # A retry on the broker's side then succeeds; a replay changes nothing; a contradiction
    # is refused.
    assert broker_side.outcome(dispatches["failed"], "deleted").status_code == 200
    replay = broker_side.outcome(dispatches["deleted"], "deleted")
    assert (replay.status_code, replay.json()["status"]) == (200, "unchanged")
    conflict = broker_side.outcome(dispatches["deleted"], "not_found")
    assert (conflict.status_code, conflict.json()["code"]) == (409, "outcome_conflict")

    # And answers each identifier retrieval: clear identifiers, or why not to delete.
    resolved_email = {"email": [{"email": "Resolved.Person@Example.com"}]}
    resolution_answers = [
        broker_side.resolved(resolutions["deleted"], identifiers=resolved_email),
        broker_side.resolved(resolutions["not_found"], identifiers=resolved_email),
        broker_side.resolved(resolutions["failed"], identifiers=resolved_email),
        broker_side.resolved(
            resolutions["opted_out"], drop_outcome="opted_out", identifiers=resolved_email
        ),
        broker_side.resolved(
            resolutions["exempt"], drop_outcome="exempt", exemption_basis="legal_hold"
        ),
    ]
    assert [a.status_code for a in resolution_answers] == [200] * 5
    assert SaasDeletion.objects.count() == 3  # none for opted_out or exempt
    assert ResolutionRequest.objects.exclude(identifiers="").count() == 3  # kept, encrypted

    run_worker(["dispatch"])  # the SaaS deletions

    erased = saas_system.wait_for(3)
    assert {r.headers["Authorization"] for r in erased} == {"Bearer mailer-token"}
    assert all(r.json["identifiers"] == resolved_email for r in erased)
    assert set(SaasDeletion.objects.values_list("state", flat=True)) == {"completed"}
    assert not ResolutionRequest.objects.exclude(identifiers="").exists()  # purged

    expected = {"deleted": 3, "not_found": 5, "opted_out": 4, "exempt": 2, "failed": 3}
    for outcome, code in expected.items():
        request = DeletionRequest.objects.get(remote_identifier=f"C-{outcome}")
        assert request.state == RequestState.COMPLETED, outcome
        assert request.drop_status_code == code, outcome
        assert WorkItem.objects.get(pk=request.work_item_id).status_code == code, outcome
    assert OptOutRecord.objects.get(deletion_request__isnull=False).email == OPTED_OUT_EMAIL
    assert OptOutRecord.objects.get(resolution_request__isnull=False).email == (
        "Resolved.Person@Example.com"
    )

    # The ledger tells the story, without the clear identifiers, and its chain verifies.
    for request in DeletionRequest.objects.all():
        kinds = list(
            LedgerEvent.objects.filter(subject=str(request.request_uuid))
            .order_by("id")
            .values_list("kind", flat=True)
        )
        assert kinds[0] == "deletion_request.delivered"
        assert "deletion_request.outcome_recorded" in kinds
    assert LedgerEvent.objects.filter(kind="callback.rejected").count() == 1
    assert LedgerEvent.objects.filter(kind="resolution_request.identifiers_purged").count() == 3
    ledger_text = json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))
    assert "Ann.Smith" not in ledger_text and "Resolved.Person" not in ledger_text
    ledger_seal()
    assert ledger_verify().ok
