"""The rules of recurring deletion rounds (``services.cycle.recurring``): which items get a
round and when, a paused target's round waiting, a failing round holding the next one, the
dashboard's counts and ``drop doctor``'s overdue rounds, rounds turned off.

Matching and outcomes run through their services; time moves by the services' ``now``.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import work_items
from dropportal import local_state
from integrations import enqueue
from integrations.consumers.api_reader import parse_api_consumers
from integrations.dispatch.webhook import deletion_dispatch_payload, resolution_notification_payload
from integrations.drop.calendar import drop_date, drop_midnight
from integrations.evidence.signing_key import EvidenceKeyRefused
from integrations.models import (
    Broker,
    Consumer,
    DeletionRequest,
    DeliveryAttempt,
    Directive,
    DirectiveReason,
    DropCycle,
    Integration,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.pulls import brokers_due_for_pull
from integrations.selectors.recurring import recurring_overview
from integrations.selectors.story import work_item_story
from integrations.selectors.stuck import StuckReason, stuck_work_items
from integrations.services.cycle.consumers import consumer_forget, consumers_register
from integrations.services.cycle.recurring import recurring_rounds_send, recurring_rounds_send_all
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.dispatch.deliveries import deletion_requests_deliver
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    webhook_integration_create,
)
from tests.builders import (
    BrokerFactory,
    ConsumerFactory,
    DeletionRequestFactory,
    SaasConnectionFactory,
    ServiceProviderFactory,
    WorkItemFactory,
    drop_noon,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

DAY = dt.timedelta(days=1)


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _target(broker: Broker, name: str = "CRM") -> Integration:
    # Port 9 (discard): a delivery that were attempted would fail and be recorded.
    return webhook_integration_create(
        broker=broker, name=name, url=f"http://127.0.0.1:9/{name}", actor="test"
    ).integration


def _answered(
    broker: Broker, target: Integration, *, code: int, outcome: str, at: dt.datetime
) -> WorkItem:
    """A work item the match answered ``outcome`` for at ``at``, settled to ``code``."""
    item = WorkItemFactory.create(cycle__broker=broker, status_code=code)
    consumer: Consumer = ConsumerFactory.create(broker=broker)
    DeletionRequestFactory.create(
        integration=target,
        work_item=item,
        consumer=consumer,
        remote_identifier=consumer.remote_identifier,
        drop_outcome=outcome,
        completed_at=at,
    )
    return item


def test_only_deleted_and_opted_out_items_get_a_round_once_it_is_due(broker: Broker) -> None:
    target = _target(broker)
    now = drop_noon()
    deleted = _answered(broker, target, code=3, outcome="deleted", at=now)
    opted_out = _answered(broker, target, code=4, outcome="opted_out", at=now - 2 * DAY)
    _answered(broker, target, code=5, outcome="not_found", at=now)
    _answered(broker, target, code=2, outcome="exempt", at=now)

    assert recurring_rounds_send(broker=broker, actor="t", now=now + 42 * DAY).work_items == 0
    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 43 * DAY)
    assert sent.work_items == 1  # its own date: 45 days after its own answer
    assert DeletionRequest.objects.get(round=1).work_item_id == opted_out.pk
    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY)
    assert (sent.work_items, sent.queued) == (1, 1)
    round_one = DeletionRequest.objects.get(round=1, work_item=deleted)
    original = DeletionRequest.objects.get(round=0, work_item=deleted)
    assert (round_one.drop_session_id, round_one.match_date) == (
        original.drop_session_id,
        original.match_date,
    )
    assert round_one.identifier_hash == base64.b64encode(bytes(deleted.hash)).decode()
    assert round_one.request_uuid != original.request_uuid
    assert round_one.webhook_request_id != original.webhook_request_id
    # Sent is not due again: the round waits for its answer.
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 90 * DAY).work_items == 0
    event = LedgerEvent.objects.filter(kind="recurring.rounds_sent").latest("id")
    assert event.data["work_items"] == 1


def test_a_round_carries_the_matchs_mode_and_broker_id_not_the_brokers_now(
    broker: Broker,
) -> None:
    """A round's body is the match's unchanged: an item matched in test mode stays a test
    deletion every round though the broker went to production (and changed its id) since."""
    target = _target(broker)
    SaasConnectionFactory.create(broker=broker)
    now = drop_noon()
    item = _answered(broker, target, code=3, outcome="deleted", at=now)
    Broker.objects.filter(pk=broker.pk).update(mode="production", broker_id="4822")
    broker.refresh_from_db()

    assert recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY).work_items == 1

    round_one = DeletionRequest.objects.get(round=1, work_item=item)
    assert (round_one.mode, round_one.broker_id_code) == ("test", "4821")
    body = deletion_dispatch_payload(round_one, target)
    assert (body["mode"], body["broker_id"]) == ("test", "4821")
    resolution = ResolutionRequest.objects.get(round=1, work_item=item)
    assert (resolution.mode, resolution.broker_id_code) == ("test", "4821")
    assert resolution_notification_payload(resolution, target)["mode"] == "test"


def test_a_rounds_date_counts_in_drops_calendar_not_utcs(broker: Broker, settings: Any) -> None:
    """An answer late in DROP's evening (the next day in UTC): the next round is due the
    recurring days after DROP's day of it (``drop.calendar``, the zone's one home)."""
    target = _target(broker)
    day = dt.date(2026, 3, 19)
    answered = drop_midnight(day) + dt.timedelta(hours=23, minutes=30)
    assert answered.astimezone(dt.UTC).date() == day + DAY  # another day in UTC
    _answered(broker, target, code=3, outcome="deleted", at=answered)
    due_on = day + settings.DROPPORTAL_RECURRING_DAYS * DAY

    assert recurring_overview(broker=broker, today=due_on - DAY).due == 0
    assert recurring_overview(broker=broker, today=due_on).due == 1


def test_a_days_rounds_go_in_batches_each_its_own_ledger_event(broker: Broker) -> None:
    target = _target(broker)
    provider = ServiceProviderFactory.create(broker=broker, name="Mailhouse")
    now = drop_noon()
    items = [_answered(broker, target, code=3, outcome="deleted", at=now) for _ in range(3)]

    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY, batch_items=2)

    assert (sent.work_items, sent.deletion_requests, sent.queued) == (3, 3, 3)
    assert sorted(
        DeletionRequest.objects.filter(round=1).values_list("work_item_id", flat=True)
    ) == sorted(item.pk for item in items)
    events = LedgerEvent.objects.filter(kind="recurring.rounds_sent").order_by("id")
    assert [(e.data["batch"], e.data["batches"], e.data["work_items"]) for e in events] == [
        (1, 2, 2),
        (2, 2, 1),
    ]
    # Each batch directs the providers for its own items.
    assert sorted(d.rows for d in Directive.objects.filter(provider=provider)) == [1, 2]
    # Sent is not due again, whatever the batch size.
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 46 * DAY).work_items == 0


def test_a_round_another_run_sent_after_the_schedule_was_read_is_not_sent_again(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from integrations.services.cycle import recurring

    target = _target(broker)
    now = drop_noon()
    first, second = (_answered(broker, target, code=3, outcome="deleted", at=now) for _ in "ab")
    locks = []
    real_lock = recurring.matching_lock

    def lock_then_race(*, broker: Broker) -> None:
        real_lock(broker=broker)
        locks.append(broker)
        if len(locks) == 2:  # the schedule is read, the first batch starts: another run won
            original = DeletionRequest.objects.get(work_item=second)
            DeletionRequestFactory.create(
                integration=target,
                work_item=second,
                consumer=original.consumer,
                round=1,
                state=RequestState.QUEUED,
            )

    monkeypatch.setattr(recurring, "matching_lock", lock_then_race)
    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY)

    assert sent.work_items == 1
    assert DeletionRequest.objects.filter(round=1, work_item=first).count() == 1
    assert DeletionRequest.objects.filter(round=1, work_item=second).count() == 1


def test_a_consumer_forgotten_after_the_schedule_was_read_is_sent_no_round_nor_counted(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read before the batch took the lock, the schedule names a consumer the broker forgets
    meanwhile: its item gets no round (no request), so the batch neither counts it nor
    directs the service providers to delete its hash."""
    from integrations.services.cycle import recurring

    target = _target(broker)
    provider = ServiceProviderFactory.create(broker=broker, name="Mailhouse")
    now = drop_noon()
    first, second = (_answered(broker, target, code=3, outcome="deleted", at=now) for _ in "ab")
    forgotten = DeletionRequest.objects.get(work_item=second).remote_identifier
    locks = []
    real_lock = recurring.matching_lock

    def lock_then_forget(*, broker: Broker) -> None:
        real_lock(broker=broker)
        locks.append(broker)
        if len(locks) == 2:  # the schedule is read, the first batch starts
            consumer_forget(broker=broker, remote_identifier=forgotten, actor="test")

    monkeypatch.setattr(recurring, "matching_lock", lock_then_forget)
    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY)

    assert (sent.work_items, sent.deletion_requests) == (1, 1)
    assert DeletionRequest.objects.filter(round=1, work_item=first).count() == 1
    assert not DeletionRequest.objects.filter(round=1, work_item=second).exists()
    event = LedgerEvent.objects.filter(kind="recurring.rounds_sent").latest("id")
    assert event.data["work_items"] == 1
    assert Directive.objects.get(provider=provider).rows == 1


def test_a_broker_whose_rounds_cannot_be_sent_holds_back_no_other_brokers_rounds(
    broker: Broker, settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The hourly job sends every broker's rounds. The first broker's fail (it has a
    service provider to direct, and the evidence key generated into var/ was damaged since):
    the next broker owes its consumers their deletion all the same, and gets its rounds; the
    job still fails, saying why."""
    settings.DROPPORTAL_EVIDENCE_KEY = ""
    monkeypatch.setattr(local_state, "VAR_DIR", tmp_path)
    (tmp_path / "evidence_key.pem").write_text("not a PEM key\n")
    other = BrokerFactory.create()
    assert broker.pk < other.pk  # the failing one comes first
    ServiceProviderFactory.create(broker=broker, name="Mailhouse")
    now = drop_noon()
    _answered(broker, _target(broker), code=3, outcome="deleted", at=now - 45 * DAY)
    owed = _answered(other, _target(other), code=3, outcome="deleted", at=now - 45 * DAY)

    with pytest.raises(EvidenceKeyRefused):
        recurring_rounds_send_all(actor="system:recurring", now=now)

    assert DeletionRequest.objects.filter(work_item=owed, round=1).count() == 1
    assert not DeletionRequest.objects.filter(broker=broker, round=1).exists()


def test_a_run_killed_between_batches_keeps_what_it_sent_and_the_next_run_sends_the_rest(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from integrations.services.cycle import recurring

    target = _target(broker)
    provider = ServiceProviderFactory.create(broker=broker, name="Mailhouse")
    now = drop_noon()
    items = [_answered(broker, target, code=3, outcome="deleted", at=now) for _ in range(3)]
    real_append = recurring.ledger_event_append
    appended = []

    def killed_in_the_second_batch(**kwargs: Any) -> None:
        appended.append(kwargs)
        if len(appended) == 2:  # its requests, jobs and directives written, not committed
            raise KeyboardInterrupt("killed")
        real_append(**kwargs)

    with monkeypatch.context() as kill:
        kill.setattr(recurring, "ledger_event_append", killed_in_the_second_batch)
        with pytest.raises(KeyboardInterrupt):
            recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY, batch_items=2)
    assert DeletionRequest.objects.filter(round=1).count() == 2  # the first batch stays sent

    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY, batch_items=2)

    assert sent.work_items == 1
    rounds = DeletionRequest.objects.filter(round=1)
    assert sorted(rounds.values_list("work_item_id", flat=True)) == sorted(i.pk for i in items)
    jobs = ProcrastinateJob.objects.filter(task_name=enqueue.DELIVER_DELETION_REQUESTS)
    queued = [pk for job in jobs for pk in job.args["request_ids"]]
    assert sorted(queued) == sorted(rounds.values_list("pk", flat=True))  # each once
    events = LedgerEvent.objects.filter(kind="recurring.rounds_sent").order_by("id")
    assert [(e.data["batch"], e.data["batches"], e.data["work_items"]) for e in events] == [
        (1, 2, 2),
        (1, 1, 1),
    ]
    assert sorted(d.rows for d in Directive.objects.filter(provider=provider)) == [1, 2]


def test_each_round_directs_the_service_providers_again(broker: Broker) -> None:
    target = _target(broker)
    provider = ServiceProviderFactory.create(broker=broker, name="Mailhouse")
    now = drop_noon()
    deleted = _answered(broker, target, code=3, outcome="deleted", at=now)
    _answered(broker, target, code=5, outcome="not_found", at=now)

    recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY)

    directive = Directive.objects.get(provider=provider)
    assert directive.reason == DirectiveReason.RECURRING
    assert directive.rows == 1  # the deleted consumer's hash, not the one never found
    hash_text = base64.b64encode(bytes(deleted.hash)).decode()
    assert bytes(directive.content).decode().splitlines()[1:] == [f"email,{hash_text}"]


def test_a_paused_targets_round_waits_and_goes_once_it_is_enabled(broker: Broker) -> None:
    target = _target(broker)
    now = drop_noon()
    item = _answered(broker, target, code=3, outcome="deleted", at=now - 46 * DAY)
    integration_disable(integration=target, reason="CRM migration", actor="staff:ann")

    assert recurring_rounds_send(broker=broker, actor="t").work_items == 1
    waiting = DeletionRequest.objects.get(round=1)
    assert waiting.state == RequestState.QUEUED
    deletion_requests_deliver(request_ids=[waiting.pk])
    assert not DeliveryAttempt.objects.filter(deletion_request=waiting).exists()  # held
    assert recurring_overview(broker=broker).sent == 1

    # Not skipped: a week later it is overdue, and drop doctor says so.
    stuck = stuck_work_items(broker=broker, now=now + 8 * DAY)
    assert [g.reason for g in stuck] == [StuckReason.RECURRING_ROUND_OVERDUE]
    assert stuck[0].work_items == 1

    integration_enable(integration=target, actor="staff:ann")
    deletion_requests_deliver(request_ids=[waiting.pk])
    assert DeliveryAttempt.objects.filter(deletion_request=waiting).exists()
    item.refresh_from_db()
    assert item.status_code == 3


def test_a_failing_round_follows_the_delivery_policy_and_never_moves_the_status(
    broker: Broker,
) -> None:
    target = _target(broker)
    now = drop_noon()
    item = _answered(broker, target, code=3, outcome="deleted", at=now - 45 * DAY)
    recurring_rounds_send(broker=broker, actor="t")
    request = DeletionRequest.objects.get(round=1)

    deletion_outcome_record(
        deletion_request=request, drop_outcome="failed", error_message="CRM down", actor="t"
    )
    overview = recurring_overview(broker=broker)
    assert (overview.failing, overview.sent, overview.answered) == (1, 0, 0)
    # Staff hear of it at once, as of any failed request: drop doctor, and its alert.
    failing = [g for g in stuck_work_items(broker=broker) if g.requests]
    assert [(g.reason, g.work_items) for g in failing] == [(StuckReason.RECURRING_ROUND_FAILING, 1)]
    story = [step.title for step in work_item_story(work_item=item)]
    assert "Recurring deletion, round 1: consumer C-" in " ".join(story)
    item.refresh_from_db()
    assert item.status_code == 3
    # No next round while this one has no final answer.
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 60 * DAY).work_items == 0

    request.refresh_from_db()
    deletion_outcome_record(deletion_request=request, drop_outcome="opted_out", actor="t")
    item.refresh_from_db()
    assert item.status_code == 3  # the round's opted_out is not DROP's status
    assert recurring_overview(broker=broker).answered == 1
    assert not LedgerEvent.objects.filter(
        kind="work_item.status_settled", subject=item.work_item_id
    ).exists()


def test_drop_recurring_says_how_many_and_refuses_when_rounds_are_off(
    broker: Broker, settings: Any
) -> None:
    admin_client = Client()
    admin_client.force_login(User.objects.create_superuser("ann", "ann@example.com", "pw-ann-123"))
    target = _target(broker)
    _answered(broker, target, code=3, outcome="deleted", at=drop_noon() - 40 * DAY)
    out = io.StringIO()
    call_command("drop", "recurring", "--broker", "4821", stdout=out)
    assert out.getvalue().startswith("0 recurring round(s) sent")
    out = io.StringIO()
    call_command("drop", "recurring", "--broker", "4821", "--ahead", "5", "--json", stdout=out)
    assert json.loads(out.getvalue())["work_items"] == 1
    page = admin_client.get("/admin/").content.decode()
    assert "Recurring deletion" in page and "sent, awaiting the answer" in page

    settings.DROPPORTAL_RECURRING_DAYS = 0
    with pytest.raises(CommandError, match="recurring deletion is off"):
        call_command("drop", "recurring", "--broker", "4821")
    page = admin_client.get("/admin/").content.decode()
    assert "dp-recurring-off" in page and "by other means" in page
    assert recurring_rounds_send(broker=broker, actor="t").work_items == 0


def test_the_law_moving_to_30_days_is_three_settings_and_the_pull_interval(
    broker: Broker, settings: Any, tmp_path: Path
) -> None:
    """A cycle at a 30-day cadence: due 30 days after its download, pulled again within 30
    days of the last pull, and a deleted consumer's deletion repeated 30 days after it."""
    settings.DROPPORTAL_REPORT_DAYS = 30
    settings.DROPPORTAL_DOWNLOAD_CADENCE_DAYS = 30
    settings.DROPPORTAL_RECURRING_DAYS = 30
    Broker.objects.filter(pk=broker.pk).update(auto_pull=True, pull_interval_days=29)
    _target(broker)
    (_, email_hash), *_ = work_items(1)
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": email_hash})
    package = write_zip(tmp_path, drop_zip(broker, {"Email": list(work_items(1))}))
    downloaded = drop_noon(-1)  # a download time is never in the future
    call_command(
        "drop", "import", "--broker", "4821", str(package),
        "--downloaded-at", downloaded.isoformat(), stdout=io.StringIO(),
    )  # fmt: skip
    cycle = DropCycle.objects.get(broker=broker)
    assert cycle.due_date == drop_date(downloaded) + 30 * DAY
    Broker.objects.filter(pk=broker.pk).update(last_pulled_at=downloaded)
    assert not brokers_due_for_pull(now=downloaded + 28 * DAY).exists()
    assert brokers_due_for_pull(now=downloaded + 29 * DAY).exists()

    request = DeletionRequest.objects.get()
    deletion_outcome_record(deletion_request=request, drop_outcome="deleted", actor="t")
    answered = drop_noon()
    assert recurring_rounds_send(broker=broker, actor="t", now=answered + 29 * DAY).work_items == 0
    assert recurring_rounds_send(broker=broker, actor="t", now=answered + 30 * DAY).work_items == 1


# ---------------------------------------------------------------- consumers that come and go

ANNA_EMAIL = "Anna.Smith@Domain.com"
ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="  # ANNA_EMAIL, as DROP hashes it


def _deleted_and_reported(
    broker: Broker, target: Integration, at: dt.datetime, *, reported: bool = True
) -> WorkItem:
    item = WorkItemFactory.create(
        cycle__broker=broker, hash=base64.b64decode(ANNA), reported=reported, status_code=3
    )
    consumer = ConsumerFactory.create(
        broker=broker, remote_identifier="C-1", hashes={"email": ANNA}
    )
    DeletionRequestFactory.create(
        integration=target,
        work_item=item,
        consumer=consumer,
        remote_identifier="C-1",
        drop_outcome="deleted",
        completed_at=at,
    )
    return item


def _sold_back_as_s9(broker: Broker) -> None:
    """A supplier sells Anna back: registered as S-9, matched to her kept DROP work item."""
    consumers_register(
        broker=broker,
        records=parse_api_consumers([{"remote_identifier": "S-9", "email": [ANNA_EMAIL]}]),
        actor="t",
        source="api",
    )


def test_a_reappearance_keeps_the_status_drop_holds_and_the_rounds_going(broker: Broker) -> None:
    """Anna comes back from a supplier (S-9) while her first consumer's round 1 is out: S-9
    is asked at once, and the round's answer settles the item again. DROP holds 3 and the
    new request is open: the item stays reported 3, so its rounds stay on the schedule."""
    target = _target(broker)
    now = drop_noon()
    item = _deleted_and_reported(broker, target, now)
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY).work_items == 1
    round_one = DeletionRequest.objects.get(round=1)
    _sold_back_as_s9(broker)
    late = DeletionRequest.objects.get(remote_identifier="S-9")
    assert (late.round, late.late_match, late.state) == (0, True, RequestState.QUEUED)

    deletion_outcome_record(deletion_request=round_one, drop_outcome="deleted", actor="t")

    item.refresh_from_db()
    assert (item.state, item.status_code, item.reported_status_code) == (
        WorkItemState.REPORTED,
        3,
        3,
    )
    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 95 * DAY)
    assert sent.work_items == 1  # round 2, to C-1 and S-9 alike
    assert set(
        DeletionRequest.objects.filter(round=2).values_list("remote_identifier", flat=True)
    ) == {"C-1", "S-9"}


def test_a_consumer_come_back_before_round_one_holds_back_neither_the_round_nor_its_date(
    broker: Broker,
) -> None:
    """Anna comes back from a supplier (S-9) ten days after her deletion was reported, before
    round 1: S-9 is asked at once and does not answer. Round 1 is still due 45 days after
    C-1's answer, goes to C-1 and S-9 alike, and a week later unsent it would be overdue."""
    target = _target(broker)
    now = drop_noon(-10)  # C-1's answer; S-9 comes today
    _deleted_and_reported(broker, target, now)
    _sold_back_as_s9(broker)
    late = DeletionRequest.objects.get(remote_identifier="S-9")
    assert (late.round, late.late_match, late.state) == (0, True, RequestState.QUEUED)

    overdue = recurring_overview(broker=broker, today=drop_date(now + 53 * DAY))
    assert (overdue.due, overdue.overdue) == (1, 1)
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 44 * DAY).work_items == 0
    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY)

    assert sent.work_items == 1
    assert set(
        DeletionRequest.objects.filter(round=1).values_list("remote_identifier", flat=True)
    ) == {"C-1", "S-9"}


def test_a_consumer_come_back_before_drop_was_told_holds_back_no_round_either(
    broker: Broker,
) -> None:
    """As above, with the item settled to 3 and not reported yet: S-9's coming opens it again
    (no status until S-9 answers), and C-1 is owed its round all the same."""
    target = _target(broker)
    now = drop_noon(-10)  # C-1's answer; S-9 comes today
    item = _deleted_and_reported(broker, target, now, reported=False)
    assert (item.state, item.status_code) == (WorkItemState.REPORTABLE, 3)
    _sold_back_as_s9(broker)
    item.refresh_from_db()
    assert (item.state, item.status_code, item.reported_status_code) == (
        WorkItemState.OPEN,
        None,
        None,
    )

    overdue = recurring_overview(broker=broker, today=drop_date(now + 53 * DAY))
    assert (overdue.due, overdue.overdue) == (1, 1)
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 44 * DAY).work_items == 0
    sent = recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY)

    assert sent.work_items == 1
    assert set(
        DeletionRequest.objects.filter(round=1).values_list("remote_identifier", flat=True)
    ) == {"C-1", "S-9"}
    item.refresh_from_db()
    assert (item.state, item.status_code) == (WorkItemState.OPEN, None)  # S-9's answer decides


def test_a_late_answer_of_a_consumer_come_back_does_not_move_the_next_rounds_date(
    broker: Broker,
) -> None:
    """The clock counts from the match's own answers: S-9, come back after C-1 was deleted,
    answers 30 days after C-1 did; round 1 is due 45 days after C-1's answer all the same, so
    C-1 is never left more than 45 days. So it stays once DROP takes a report of the item
    again (an amendment) after S-9 came."""
    target = _target(broker)
    now = drop_noon(-10)  # C-1's answer; S-9 comes today
    item = _deleted_and_reported(broker, target, now)
    _sold_back_as_s9(broker)
    late = DeletionRequest.objects.get(remote_identifier="S-9")
    deletion_outcome_record(deletion_request=late, drop_outcome="deleted", actor="t")
    DeletionRequest.objects.filter(pk=late.pk).update(completed_at=now + 30 * DAY)
    WorkItem.objects.filter(pk=item.pk).update(reported_at=now + 31 * DAY)

    assert recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY).work_items == 1


def test_a_consumer_come_back_once_drop_holds_the_status_holds_back_no_round(
    broker: Broker,
) -> None:
    """DROP held Anna's 3 before S-9 came: the item had settled, whatever time C-1's answer
    carries (here noon tomorrow, later than S-9's match: the clock of the host that recorded
    it, say, runs ahead). Round 1 is due 45 days after C-1's answer."""
    target = _target(broker)
    now = drop_noon(1)
    _deleted_and_reported(broker, target, now)
    _sold_back_as_s9(broker)

    assert recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY).work_items == 1


def test_a_consumer_come_back_while_an_amendment_is_owed_holds_back_no_round(
    broker: Broker,
) -> None:
    """DROP holds Anna's 3; S-9, come back, answered opted_out, so a 4 is owed to DROP as an
    amendment. Then S-10 comes back too. While S-10's request is open the amendment waits
    for its answer, DROP still holds 3, and the rounds go on: round 1 is due 45 days after
    C-1's answer and goes to every consumer. S-10's answer then leaves the 4 owed."""
    target = _target(broker)
    now = drop_noon(-10)  # C-1's answer
    item = _deleted_and_reported(broker, target, now)
    _sold_back_as_s9(broker)
    deletion_outcome_record(
        deletion_request=DeletionRequest.objects.get(remote_identifier="S-9"),
        drop_outcome="opted_out",
        actor="t",
    )
    item.refresh_from_db()
    assert (item.status_code, item.state, item.reported_status_code, item.needs_amendment) == (
        4,
        WorkItemState.REPORTABLE,
        3,
        True,
    )

    consumers_register(
        broker=broker,
        records=parse_api_consumers(
            [{"remote_identifier": "S-10", "email": ["Anna.Smith@Domain.com"]}]
        ),
        actor="t",
        source="api",
    )
    late = DeletionRequest.objects.get(remote_identifier="S-10")
    assert (late.round, late.late_match, late.state) == (0, True, RequestState.QUEUED)

    # No amendment goes out while a target owes S-10's answer; DROP still holds 3.
    item.refresh_from_db()
    assert item.reported_status_code == 3
    assert not WorkItem.objects.reportable().filter(pk=item.pk).exists()
    overdue = recurring_overview(broker=broker, today=drop_date(now + 53 * DAY))
    assert (overdue.due, overdue.overdue) == (1, 1)
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 44 * DAY).work_items == 0
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY).work_items == 1
    assert set(
        DeletionRequest.objects.filter(round=1).values_list("remote_identifier", flat=True)
    ) == {"C-1", "S-9", "S-10"}

    deletion_outcome_record(deletion_request=late, drop_outcome="deleted", actor="t")
    item.refresh_from_db()
    assert (item.status_code, item.state, item.reported_status_code, item.needs_amendment) == (
        4,
        WorkItemState.REPORTABLE,
        3,
        True,
    )
    assert WorkItem.objects.awaiting_amendment().filter(pk=item.pk).exists()


@pytest.mark.parametrize("held", [5, 2])
def test_a_consumer_come_back_while_drop_holds_another_code_holds_back_no_round(
    broker: Broker, held: int
) -> None:
    """DROP holds 5 (or 2); C-1, registered since, was matched late and answered deleted, so a
    3 is owed as an amendment. Then Anna comes back (S-9): the item has no status while
    S-9's request is open, DROP still holds the old code, and C-1 is owed its round all the
    same."""
    target = _target(broker)
    now = drop_noon(-10)  # C-1's answer; S-9 comes today
    item = WorkItemFactory.create(
        cycle__broker=broker, hash=base64.b64decode(ANNA), reported=True, status_code=held
    )
    consumers_register(
        broker=broker,
        records=parse_api_consumers([{"remote_identifier": "C-1", "email": [ANNA_EMAIL]}]),
        actor="t",
        source="api",
    )
    first = DeletionRequest.objects.get(remote_identifier="C-1", integration=target)
    deletion_outcome_record(deletion_request=first, drop_outcome="deleted", actor="t")
    DeletionRequest.objects.filter(pk=first.pk).update(completed_at=now)
    item.refresh_from_db()
    assert (item.status_code, item.reported_status_code, item.needs_amendment) == (3, held, True)
    _sold_back_as_s9(broker)
    item.refresh_from_db()
    assert (item.state, item.status_code, item.reported_status_code) == (
        WorkItemState.OPEN,
        None,
        held,
    )

    overdue = recurring_overview(broker=broker, today=drop_date(now + 53 * DAY))
    assert (overdue.due, overdue.overdue) == (1, 1)
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 44 * DAY).work_items == 0
    assert recurring_rounds_send(broker=broker, actor="t", now=now + 45 * DAY).work_items == 1
    assert set(
        DeletionRequest.objects.filter(round=1).values_list("remote_identifier", flat=True)
    ) == {"C-1", "S-9"}


def test_a_consumer_forgotten_since_is_owed_no_round_and_none_is_overdue(broker: Broker) -> None:
    """A round goes to the consumers the match found; once the broker has forgotten them
    there is no one to send it to, so it is neither due nor overdue for ever."""
    target = _target(broker)
    now = drop_noon(-60)
    _deleted_and_reported(broker, target, now)
    consumer_forget(broker=broker, remote_identifier="C-1", actor="t")

    assert recurring_rounds_send(broker=broker, actor="t").work_items == 0
    overview = recurring_overview(broker=broker)
    assert (overview.due, overview.overdue) == (0, 0)
    assert stuck_work_items(broker=broker) == []


def test_a_failed_answer_for_a_consumer_come_back_is_listed_for_staff(broker: Broker) -> None:
    """The item stays reported while the new consumer's request is out; a failure of that
    request still waits for staff, and ``drop doctor`` must say so."""
    target = _target(broker)
    now = drop_noon()
    _deleted_and_reported(broker, target, now)
    _sold_back_as_s9(broker)
    late = DeletionRequest.objects.get(remote_identifier="S-9")
    deletion_outcome_record(
        deletion_request=late, drop_outcome="failed", error_message="CRM timeout", actor="t"
    )

    groups = {(g.reason, g.work_items) for g in stuck_work_items(broker=broker)}
    assert (StuckReason.FAILED_WAITING_FOR_STAFF, 1) in groups


def _blocked(broker: Broker, now: dt.datetime) -> set[tuple[StuckReason, int, int]]:
    return {
        (g.reason, g.work_items, g.requests)
        for g in stuck_work_items(broker=broker, now=now)
        if g.reason == StuckReason.RECURRING_ROUND_BLOCKED
    }


def test_a_status_staff_set_over_the_matchs_open_request_is_listed_once_a_round_is_owed(
    broker: Broker, admin_client: Client
) -> None:
    """The match's own request undeliverable (the target is gone), staff set 3 by hand: no
    round can start over the open request, so once a round would have been owed ``drop
    doctor`` says so; nothing is counted due, nor sent, meanwhile."""
    target = _target(broker)
    item = WorkItemFactory.create(cycle__broker=broker, status_code=None)
    consumer: Consumer = ConsumerFactory.create(broker=broker)
    request = DeletionRequestFactory.create(
        integration=target,
        work_item=item,
        consumer=consumer,
        remote_identifier=consumer.remote_identifier,
        state=RequestState.UNDELIVERABLE,
    )
    work_item_status_set(
        work_item=item, status_code=3, reason="deleted by hand in the CRM", actor="staff:ann"
    )

    assert _blocked(broker, drop_noon(44)) == set()
    assert _blocked(broker, drop_noon(46)) == {(StuckReason.RECURRING_ROUND_BLOCKED, 1, 1)}
    group = next(
        g
        for g in stuck_work_items(broker=broker, now=drop_noon(46))
        if g.reason == StuckReason.RECURRING_ROUND_BLOCKED
    )
    assert group.nearest_due_date == drop_date(drop_noon(45))
    # Its link lists the open request: 200, not the 302 of a filter the admin refuses.
    page = admin_client.get(group.admin_path)
    assert page.status_code == 200, group.admin_path
    assert str(request.request_uuid) in page.content.decode()
    overview = recurring_overview(broker=broker, today=drop_date(drop_noon(120)))
    assert (overview.due, overview.overdue) == (0, 0)
    assert recurring_rounds_send(broker=broker, actor="t", now=drop_noon(120)).work_items == 0


def test_an_ordinary_late_match_to_an_item_drop_holds_as_5_is_never_listed_blocked(
    broker: Broker,
) -> None:
    """DROP holds 5; C-1, registered since, is matched late to two targets, one answers
    deleted, the other has not answered: the match's requests are open, but no staff set
    a status, so nothing says rounds are blocked, however long it waits."""
    _target(broker)
    other = _target(broker, "ERP")
    item = WorkItemFactory.create(
        cycle__broker=broker, hash=base64.b64decode(ANNA), reported=True, status_code=5
    )
    consumers_register(
        broker=broker,
        records=parse_api_consumers([{"remote_identifier": "C-1", "email": [ANNA_EMAIL]}]),
        actor="t",
        source="api",
    )
    answered = DeletionRequest.objects.get(remote_identifier="C-1", integration=other)
    deletion_outcome_record(deletion_request=answered, drop_outcome="deleted", actor="t")
    item.refresh_from_db()
    assert (item.status_code, item.reported_status_code) == (None, 5)
    assert (
        DeletionRequest.objects.filter(work_item=item, round=0)
        .exclude(state=RequestState.COMPLETED)
        .exists()
    )

    for days in (46, 120):
        assert _blocked(broker, drop_noon(days)) == set()
