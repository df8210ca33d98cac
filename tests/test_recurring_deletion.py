"""Recurring deletion, end to end over real HTTP, for each kind of target: a deleted
consumer's deletion is asked again every ``DROPPORTAL_RECURRING_DAYS`` after its last
round's final outcome (Civil Code 1798.99.86(d)).

A webhook broker (``BrokerSimulator``) and an ISI broker (``IsiSimulator``, with a SaaS
connection the identifiers go to) each get a DROP package of two consumers: one the broker
deletes (status 3), one it does not know (status 5). When the clock has moved 45 days, the
worker's job sends the deleted consumer's round, and only its: the same dispatch body with a
new ``request_uuid`` and ``webhook_request_id``. The broker answers the round with another
outcome; it is recorded and ledgered as recurring, and the work item's status stays what DROP
holds. ``drop recurring --ahead`` sends the next round before it is due; once DROP removes the
identifier no round is sent again.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.management import call_command
from django.utils import timezone

from devtools.broker_simulator import BrokerSimulator, ReceivedRequest
from devtools.drop_simulator import work_items
from devtools.isi_simulator import IsiSimulator
from integrations.drop.calendar import drop_date
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.recurring import recurring_overview
from integrations.services.cycle.recurring import recurring_rounds_send_all
from integrations.services.ledger import ledger_seal, ledger_verify
from integrations.services.staff.keys import api_key_create
from tests.builders import (
    ConsumerFactory,
    broker_connections,
    drop_noon,
    drop_zip,
    run_worker,
    work_item_of,
    write_zip,
)
from tests.test_whole_cycle import RESOLVED, IsiSide, WebhookSide

pytestmark = pytest.mark.django_db(transaction=True)

CONSUMERS = ["C-deleted", "C-not_found"]
# What identifies a dispatch, not its body: a round's are new.
NEW_PER_ROUND = {"request_uuid", "webhook_request_id", "results_token"}


@pytest.fixture
def saas_system() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/v1/erase") as running:
        yield running


@pytest.fixture(params=["webhook", "isi"])
def side(request: pytest.FixtureRequest, live_server: Any) -> Iterator[WebhookSide | IsiSide]:
    if request.param == "webhook":
        with BrokerSimulator(path="/drop/webhook") as system:
            yield WebhookSide(system)
        return
    with IsiSimulator(connections=broker_connections(), identifiers=RESOLVED) as isi:
        auth = [
            "--token-url", isi.token_url,
            "--client-id", isi.client_id, "--client-secret", isi.client_secret,
        ]  # fmt: skip
        yield IsiSide(isi, auth=auth, public_url=live_server.url, targets=2)


def _deletes(side: WebhookSide | IsiSide, seen: set[str]) -> dict[str, list[ReceivedRequest]]:
    """The deletion dispatches not ``seen`` yet, by consumer (each once: an ISI call refused
    401 is made again with a new token)."""
    if isinstance(side, WebhookSide):
        received = [
            r for r in side.system.received if r.json.get("topic") == "drop.deletion:create"
        ]
    else:
        received = side.system.on("delete")
    grouped: dict[str, list[ReceivedRequest]] = {}
    for request in {r.json["request_uuid"]: r for r in received}.values():
        if request.json["request_uuid"] not in seen:
            seen.add(request.json["request_uuid"])
            grouped.setdefault(request.json["remote_identifier"], []).append(request)
    return grouped


def _answer(side: WebhookSide | IsiSide, deletes: list[ReceivedRequest], outcome: str) -> None:
    for delete in deletes:
        response = side.outcome(delete, outcome)
        assert response.status_code == 200, response.content


def _body(dispatch: ReceivedRequest) -> dict[str, Any]:
    return {k: v for k, v in dispatch.json.items() if k not in NEW_PER_ROUND}


def test_a_deleted_consumer_gets_a_round_every_45_days_that_never_changes_its_status(
    side: WebhookSide | IsiSide,
    broker: Broker,
    saas_system: BrokerSimulator,
    live_server: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = live_server.url
    side.staff_add()
    isi = isinstance(side, IsiSide)
    if isi:  # the identifiers go to a SaaS connection, round after round
        call_command(
            "saas", "add", "--broker", "4821", "--name", "Mailer", "--url", saas_system.url,
            "--token", "mailer-token", stdout=io.StringIO(),
        )  # fmt: skip
    side.key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    items = list(work_items(len(CONSUMERS)))
    for remote, (_, email_hash) in zip(CONSUMERS, items, strict=True):
        ConsumerFactory.create(
            broker=broker, remote_identifier=remote, hashes={"email": email_hash}
        )
    package = write_zip(tmp_path, drop_zip(broker, {"Email": items}))
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())

    # The match: dispatched, answered, settled to 3 and 5.
    run_worker(["dispatch"])
    run_worker(["dispatch"])  # the SaaS deletions the identifiers started
    seen: set[str] = set()
    first = _deletes(side, seen)
    _answer(side, first["C-deleted"], "deleted")
    _answer(side, first["C-not_found"], "not_found")
    run_worker(["dispatch"])
    deleted = work_item_of(DeletionRequest.objects.filter(remote_identifier="C-deleted")[0])
    assert {w.status_code for w in WorkItem.objects.all()} == {3, 5}
    assert deleted.status_code == 3

    # Not due before 45 days.
    assert recurring_rounds_send_all(actor="system:recurring") == 0
    later = drop_noon(45)
    assert recurring_overview(broker=broker, today=drop_date(later)).due == 1

    # The clock moves 45 days: the worker's job sends the deleted consumer's round only.
    assert recurring_rounds_send_all(actor="system:recurring", now=later) == 1
    round_one = DeletionRequest.objects.filter(round=1)
    assert {r.remote_identifier for r in round_one} == {"C-deleted"}
    assert round_one.count() == side.targets
    assert ResolutionRequest.objects.filter(round=1).count() == (side.targets if isi else 0)
    run_worker(["dispatch"])
    run_worker(["dispatch"])
    again = _deletes(side, seen)
    assert set(again) == {"C-deleted"}
    originals = first["C-deleted"]
    assert sorted(json.dumps(_body(d), sort_keys=True) for d in again["C-deleted"]) == sorted(
        json.dumps(_body(d), sort_keys=True) for d in originals
    )
    assert not {d.json["request_uuid"] for d in again["C-deleted"]} & {
        d.json["request_uuid"] for d in originals
    }
    if isinstance(side, WebhookSide):
        assert (
            again["C-deleted"][0].json["webhook_request_id"]
            != (originals[0].json["webhook_request_id"])
        )
    else:  # the SaaS connection was asked again too
        assert SaasDeletion.objects.filter(resolution__round=1, state="completed").exists()

    # The broker answers the round differently: recorded, ledgered as recurring; the status
    # DROP holds for the item does not move.
    _answer(side, again["C-deleted"], "not_found")
    run_worker(["dispatch"])
    assert set(round_one.values_list("state", "drop_outcome")) == {
        (RequestState.COMPLETED, "not_found")
    }
    event = LedgerEvent.objects.get(
        kind="deletion_request.outcome_recorded", subject=str(round_one[0].request_uuid)
    )
    assert (event.data["recurring"], event.data["round"]) == (True, 1)
    deleted.refresh_from_db()
    assert (deleted.status_code, deleted.state) == (3, WorkItemState.REPORTABLE)
    assert recurring_overview(broker=broker).answered == 1
    # The outcome history (and so the evidence pack) tells the rounds apart.
    audit = api_key_create(broker=broker, scopes=["audit"], actor="test").key
    history = requests.get(
        f"{live_server.url}/api/v1/drop/outcomes",
        headers={"Authorization": f"Bearer {audit}"},
        timeout=10,
    ).json()["results"]
    assert sorted(
        (row["remote_identifier"], row["round"], row["drop_outcome"])
        for row in history
        if row["remote_identifier"] == "C-deleted"
    ) == [("C-deleted", 0, "deleted")] * side.targets + [("C-deleted", 1, "not_found")] * (
        side.targets
    )

    # Before a holiday, staff send the next round now, 44 days early.
    out = io.StringIO()
    call_command("drop", "recurring", "--broker", "4821", "--ahead", "45", "--json", stdout=out)
    assert json.loads(out.getvalue())["work_items"] == 1
    assert DeletionRequest.objects.filter(round=2).count() == side.targets

    # DROP removes the identifier: no round after that, whatever the clock says.
    DeletionRequest.objects.filter(round=2).update(
        state=RequestState.COMPLETED, drop_outcome="deleted", completed_at=timezone.now()
    )
    removal = write_zip(
        tmp_path,
        drop_zip(broker, {"Email": []}, removed=[(deleted.work_item_id, items[0][1], "Email")],
                 date="20260313"),
        name="20260313_4821_DROP.zip",
    )  # fmt: skip
    call_command("drop", "import", "--broker", "4821", str(removal), stdout=io.StringIO())
    deleted.refresh_from_db()
    assert deleted.state == WorkItemState.REMOVED
    far = timezone.now() + dt.timedelta(days=400)
    assert recurring_rounds_send_all(actor="system:recurring", now=far) == 0
    assert not DeletionRequest.objects.filter(round=3).exists()

    ledger_seal()
    assert ledger_verify().ok
