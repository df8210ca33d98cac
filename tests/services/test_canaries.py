"""Canaries: staff name a broker's test consumers, and each round sends each one a deletion to
every target with drop_session_id "0". Only ``deleted`` in time passes; anything else, or
silence past ``DROPPORTAL_CANARY_HOURS``, alerts and fails the pack's actioning component. A
round is never a DROP cycle: nothing of it reaches a response file or DROP's figures."""

from __future__ import annotations

import datetime as dt
import io
import json
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from devtools.drop_simulator import work_items
from integrations.dispatch.isi import delete_payload
from integrations.dispatch.webhook import deletion_dispatch_payload
from integrations.drop.calendar import drop_date, drop_today
from integrations.models import (
    Broker,
    Canary,
    CanaryRound,
    Consumer,
    DeletionRequest,
    DropCycle,
    Integration,
    LedgerEvent,
    ReportFile,
    RequestState,
)
from integrations.selectors.canaries import canary_round_results
from integrations.selectors.deadlines import cycle_deadlines
from integrations.selectors.drop_metrics import drop_metrics
from integrations.selectors.outcomes import deletion_outcomes
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.evidence.components.actioning import NO_CANARY, build
from integrations.services.evidence.components.base import PackContext
from integrations.services.evidence.evidence_period import Period
from integrations.services.evidence.evidence_writer import PackWriter
from integrations.services.reporting.report_files import report_files_write
from integrations.services.staff.alerts import alerts_evaluate
from integrations.services.staff.integrations import integration_retire
from tests.builders import (
    BrokerFactory,
    ConsumerFactory,
    IsiConnectionFactory,
    WebhookIntegrationFactory,
    broker_in_production,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(4))
CANARY = "TEST-CANARY-1"


@pytest.fixture
def targets(broker: Broker) -> tuple[Integration, Integration]:
    """A webhook integration and an ISI connection taking part in DROP."""
    webhook = WebhookIntegrationFactory.create(broker=broker)
    connection = IsiConnectionFactory.create(integration__broker=broker)
    return webhook, connection.integration


@pytest.fixture
def canary(broker: Broker) -> str:
    ConsumerFactory.create(broker=broker, remote_identifier=CANARY, hashes={"email": ITEMS[3][1]})
    call_command("consumers", "canary", "--broker", "4821", CANARY, stdout=io.StringIO())
    return CANARY


def drop_canary(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("drop", "canary", "--broker", "4821", "--json", *args, stdout=out)
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def answer(request: DeletionRequest, outcome: str, error_message: str = "") -> None:
    deletion_outcome_record(
        deletion_request=request,
        drop_outcome=outcome,
        error_message=error_message,
        actor="apikey:dpk_test",
    )


def actioning(broker: Broker, now: dt.datetime) -> Any:
    period = Period(
        broker=broker, cycle=None, since=now - dt.timedelta(days=30), until=now + dt.timedelta(1)
    )
    writer = PackWriter(io.BytesIO())
    return build(PackContext(broker=broker, period=period, writer=writer, exported_at=now))


# -- naming canaries


def test_staff_name_and_remove_a_canary_each_a_ledger_event(broker: Broker) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier=CANARY)
    out = io.StringIO()

    call_command("consumers", "canary", "--broker", "4821", CANARY, stdout=out)

    assert f"{CANARY} is a canary of broker 4821" in out.getvalue()
    assert list(Canary.objects.values_list("broker__broker_id", "remote_identifier")) == [
        ("4821", CANARY)
    ]
    # 03:00 UTC on July 2 is still July 1 in California, the calendar staff read dates in.
    Canary.objects.update(created_at=dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC))
    listed = io.StringIO()
    call_command("consumers", "canary", "--broker", "4821", stdout=listed)
    assert listed.getvalue().startswith(CANARY)
    assert listed.getvalue().rstrip().endswith(", 2026-07-01)")

    call_command("consumers", "canary", "--broker", "4821", CANARY, "--remove", stdout=out)

    assert not Canary.objects.exists()
    events = LedgerEvent.objects.filter(kind__startswith="canary.").order_by("id")
    assert [(e.kind, e.subject, e.broker_id) for e in events] == [
        ("canary.added", CANARY, "4821"),
        ("canary.removed", CANARY, "4821"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["NOT-REGISTERED"], "broker 4821 has no consumer registered as 'NOT-REGISTERED'"),
        (["OTHER-BROKERS"], "broker 4821 has no consumer registered as 'OTHER-BROKERS'"),
        ([CANARY], f"'{CANARY}' is a canary of broker 4821 already"),
        (["C-9", "--remove"], "'C-9' is not a canary of broker 4821"),
    ],
)
def test_a_canary_is_a_consumer_registered_for_that_broker(
    broker: Broker, canary: str, args: list[str], message: str
) -> None:
    ConsumerFactory.create(
        broker=BrokerFactory.create(broker_id="7777"), remote_identifier="OTHER-BROKERS"
    )
    ConsumerFactory.create(broker=broker, remote_identifier="C-9")

    with pytest.raises(CommandError, match=message):
        call_command("consumers", "canary", "--broker", "4821", *args)

    assert list(Canary.objects.values_list("remote_identifier", flat=True)) == [CANARY]


# -- rounds


def test_drop_canary_sends_each_canary_to_every_target_with_session_0(
    broker: Broker, targets: tuple[Integration, Integration], canary: str
) -> None:
    sent = drop_canary()

    assert (sent["canaries"], sent["targets"], sent["deletion_requests"]) == ([CANARY], 2, 2)
    requests = DeletionRequest.objects.filter(canary_round_id=sent["canary_round"])
    assert {(r.integration_id, r.state, r.work_item_id) for r in requests} == {
        (targets[0].pk, RequestState.QUEUED, None),
        (targets[1].pk, RequestState.QUEUED, None),
    }
    webhook = requests.get(isi_connection__isnull=True)
    body = deletion_dispatch_payload(webhook, targets[0])
    assert (body["drop_session_id"], body["remote_identifier"], body["identifier_hash"]) == (
        "0",
        CANARY,
        ITEMS[3][1],
    )
    assert body["match_date"] == drop_today().isoformat()
    isi = delete_payload(requests.get(isi_connection__isnull=False))
    assert (isi["drop_context"]["drop_session_id"], isi["remote_identifier"]) == ("0", CANARY)
    event = LedgerEvent.objects.get(kind="canary.round_sent")
    assert (event.data["drop_session_id"], event.data["deletion_requests"]) == ("0", 2)
    assert not DropCycle.objects.exists()  # a round is no DROP cycle


def test_drop_canary_without_a_canary_is_refused(broker: Broker) -> None:
    with pytest.raises(CommandError, match="broker 4821 has no canary"):
        call_command("drop", "canary", "--broker", "4821")

    assert not CanaryRound.objects.exists()


def test_a_canary_forgotten_by_the_broker_fails_the_round(
    broker: Broker, targets: tuple[Integration, Integration], canary: str
) -> None:
    Consumer.objects.filter(broker=broker, remote_identifier=CANARY).delete()  # forgotten

    with pytest.raises(CommandError, match=f"the round fails: {CANARY} is not registered"):
        call_command("drop", "canary", "--broker", "4821", stdout=io.StringIO())

    (result,) = canary_round_results(rounds=CanaryRound.objects.all(), now=timezone.now())
    assert result.result == "failed"


def test_a_target_retired_while_its_canary_request_is_open_is_retired(
    broker: Broker, targets: tuple[Integration, Integration], canary: str
) -> None:
    """A canary's request belongs to no work item: the retirement cancels it (the round
    fails, honestly) and has no work item of it to settle."""
    webhook, _ = targets
    sent = drop_canary()

    retired = integration_retire(integration=webhook, reason="replaced", actor="test")

    assert retired.deletion_requests_cancelled == 1
    assert retired.work_items == 0
    request = DeletionRequest.objects.get(canary_round_id=sent["canary_round"], integration=webhook)
    assert request.state == RequestState.CANCELLED
    (result,) = canary_round_results(rounds=CanaryRound.objects.all(), now=timezone.now())
    assert result.result == "failed"


def test_deleted_everywhere_passes_the_round_and_the_component(
    broker: Broker, targets: tuple[Integration, Integration], canary: str
) -> None:
    sent = drop_canary()
    for request in DeletionRequest.objects.filter(canary_round_id=sent["canary_round"]):
        answer(request, "deleted")
    now = timezone.now()

    (result,) = canary_round_results(rounds=CanaryRound.objects.all(), now=now)

    assert result.result == "passed"
    assert len(result.by_target()) == 2
    assert alerts_evaluate(now=now).raised == []
    component = actioning(broker, now)
    assert component.passed, component.tests
    (recorded,) = component.records["canary_rounds"]
    assert recorded["result"] == "passed"
    assert {a["drop_outcome"] for t in recorded["targets"].values() for a in t} == {"deleted"}


def test_a_failed_answer_alerts_and_fails_the_component(
    broker: Broker, targets: tuple[Integration, Integration], canary: str
) -> None:
    sent = drop_canary()
    requests = DeletionRequest.objects.filter(canary_round_id=sent["canary_round"])
    webhook, isi = (
        requests.get(isi_connection__isnull=True),
        requests.get(isi_connection__isnull=False),
    )
    answer(isi, "deleted")
    answer(webhook, "failed", error_message="CRM timeout")
    now = timezone.now()

    raised = alerts_evaluate(now=now).raised

    assert [a.condition for a in raised] == ["canary_failed"]
    assert "answered failed (CRM timeout)" in raised[0].text
    assert f"{CANARY} at Acme CRM" in raised[0].text
    component = actioning(broker, now)
    assert not component.passed
    every_round, at_least_one = component.tests
    assert not every_round.passed and "answered failed (CRM timeout)" in every_round.detail
    assert not at_least_one.passed and at_least_one.detail.startswith(NO_CANARY)

    # A later round that passes ends the alert.
    later = drop_canary()
    for request in DeletionRequest.objects.filter(canary_round_id=later["canary_round"]):
        answer(request, "deleted")
    assert [a.condition for a in alerts_evaluate(now=timezone.now()).cleared] == ["canary_failed"]


@pytest.mark.parametrize("outcome", ["not_found", "exempt"])
def test_any_answer_but_deleted_fails(
    broker: Broker, targets: tuple[Integration, Integration], canary: str, outcome: str
) -> None:
    sent = drop_canary()
    for request in DeletionRequest.objects.filter(canary_round_id=sent["canary_round"]):
        answer(request, outcome)

    (result,) = canary_round_results(rounds=CanaryRound.objects.all(), now=timezone.now())

    assert result.result == "failed"
    assert all(f"answered {outcome}" in problem for problem in result.problems)


def test_no_answer_within_the_canary_hours_alerts(
    broker: Broker, targets: tuple[Integration, Integration], canary: str, settings: Any
) -> None:
    settings.DROPPORTAL_CANARY_HOURS = 24
    drop_canary()
    canary_round = CanaryRound.objects.get()
    assert canary_round.answer_by - canary_round.started_at == dt.timedelta(hours=24)

    assert alerts_evaluate(now=canary_round.answer_by).raised == []  # still in time
    (result,) = canary_round_results(rounds=[canary_round], now=canary_round.answer_by)
    assert result.result == "open"

    late = canary_round.answer_by + dt.timedelta(seconds=1)
    raised = alerts_evaluate(now=late).raised

    assert [a.condition for a in raised] == ["canary_failed"]
    assert "no answer by" in raised[0].text
    assert not actioning(broker, late).passed


def test_no_canary_round_in_the_period_fails_the_component(broker: Broker) -> None:
    component = actioning(broker, timezone.now())

    assert not component.passed
    assert component.tests[1].detail == NO_CANARY


# -- a round is not a DROP cycle


def test_each_cycle_runs_a_round_that_never_reaches_drop_nor_its_figures(
    broker: Broker, canary: str, tmp_path: Path
) -> None:
    broker_in_production(broker)  # its cycles count in the yearly figures
    WebhookIntegrationFactory.create(broker=broker)
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    package = drop_zip(broker, {"Email": ITEMS[:3]})

    imported = drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test")

    canary_round = CanaryRound.objects.get()
    assert canary_round.cycle == imported.cycle
    for request in DeletionRequest.objects.filter(broker=broker):
        answer(request, "deleted")
    cycle = imported.cycle
    cycle.refresh_from_db()
    assert (cycle.work_items, cycle.matched) == (3, 1)
    report_files_write(broker=broker, actor="test")
    rows = b"".join(bytes(f.content) for f in ReportFile.objects.all()).decode()
    assert sorted(line for line in rows.splitlines() if line != "Id,Status") == sorted(
        [f"{ITEMS[0][0]},3", f"{ITEMS[1][0]},5", f"{ITEMS[2][0]},5"]
    )
    assert [d.cycle.drop_session_id for d in cycle_deadlines(today=drop_today())] == ["1"]
    assert {row["drop_session_id"] for row in deletion_outcomes(broker_id="4821")} == {"1"}
    total = drop_metrics(broker=broker, year=drop_date(cycle.downloaded_at).year).total
    assert (total.figures["received"], total.figures["matched"]) == (3, 1)
    (result,) = canary_round_results(rounds=CanaryRound.objects.all(), now=timezone.now())
    assert result.result == "passed"
    # The cycle's evidence pack holds the round its import ran.
    period = Period(broker=broker, cycle=cycle, since=None, until=None)
    writer = PackWriter(io.BytesIO())
    now = timezone.now()
    component = build(PackContext(broker=broker, period=period, writer=writer, exported_at=now))
    assert [r["cycle"] for r in component.records["canary_rounds"]] == ["1"]
    assert component.passed, component.tests
    assert component.records["deletion_requests_by_target"] == {"Acme CRM": {"deleted": 1}}


def test_the_dashboard_shows_each_round_per_target(
    broker: Broker, targets: tuple[Integration, Integration], canary: str
) -> None:
    sent = drop_canary()
    requests = DeletionRequest.objects.filter(canary_round_id=sent["canary_round"])
    answer(requests.get(isi_connection__isnull=True), "failed", error_message="CRM timeout")
    client = Client()
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-123"))

    page = unescape(client.get("/admin/").content.decode())

    assert "Canary rounds" in page
    assert f"{CANARY}: failed (answered failed (CRM timeout))" in page
    assert f"{CANARY}: queued" in page  # the ISI connection's, not answered yet
    assert f'href="/admin/integrations/canaryround/{sent["canary_round"]}/change/"' in page
    detail = client.get(f"/admin/integrations/canaryround/{sent['canary_round']}/change/")
    assert "answered failed (CRM timeout)" in unescape(detail.content.decode())


def test_a_round_missing_one_of_its_requests_does_not_pass(
    broker: Broker, targets: tuple[Integration, Integration], canary: str
) -> None:
    """A round sent its canary to two targets; a request that is no longer there was never
    answered deleted, so the round cannot pass on the other target's answer alone."""
    sent = drop_canary()
    requests = DeletionRequest.objects.filter(canary_round_id=sent["canary_round"])
    assert requests.count() == 2
    requests.filter(isi_connection__isnull=True).delete()  # one target's request, gone
    for request in requests:
        answer(request, "deleted")
    now = timezone.now()

    (result,) = canary_round_results(rounds=CanaryRound.objects.all(), now=now)

    assert result.result == "failed"
    assert any("1 of 2 request(s)" in problem for problem in result.problems), result.problems
    assert not actioning(broker, now).passed
