"""A work item's status: settled from its requests' outcomes, or set by staff."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle import work_items as work_items_module
from integrations.services.cycle.work_items import (
    work_item_settle,
    work_item_status_set,
    work_items_settle,
    work_items_settle_by_id,
)
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.ledger import ledger_verify
from tests.builders import (
    DeletionRequestFactory,
    DropCycleFactory,
    ResolutionRequestFactory,
    WebhookIntegrationFactory,
    WorkItemFactory,
)

pytestmark = pytest.mark.django_db

C, F, CX = RequestState.COMPLETED, RequestState.FAILED, RequestState.CANCELLED


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ([(C, "deleted")], 3),
        ([(C, "not_found")], 5),
        ([(C, "exempt")], 2),
        ([(C, "opted_out")], 4),
        ([(C, "deleted"), (C, "opted_out")], 4),
        ([(C, "not_found"), (C, "deleted")], 3),
        ([(C, "not_found"), (C, "exempt")], 2),
        ([(C, "exempt"), (C, "deleted")], 3),
        ([(C, "deleted"), (F, "failed")], None),
        ([(C, "deleted"), (RequestState.UNDELIVERABLE, "")], None),
        ([(C, "deleted"), (RequestState.DISPATCHED, "")], None),
        ([(C, "deleted"), (RequestState.QUEUED, "")], None),
        ([(C, "deleted"), (RequestState.PENDING, "")], None),
        ([(C, "deleted"), (CX, "")], 3),
        ([(CX, "")], 5),
    ],
)
def test_status_follows_the_strongest_final_outcome(
    broker: Broker, requests: list[tuple[str, str]], expected: int | None
) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    for state, outcome in requests:
        DeletionRequestFactory.create(work_item=item, state=state, drop_outcome=outcome)

    settled = work_item_settle(work_item=item)

    assert settled.status_code == expected
    assert settled.state == (WorkItemState.OPEN if expected is None else WorkItemState.REPORTABLE)
    assert WorkItem.objects.get(pk=item.pk).status_code == expected


def test_resolution_outcomes_count_and_saas_deletions_must_be_final(broker: Broker) -> None:
    integration = WebhookIntegrationFactory.create(broker=broker)
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, completed=True)
    resolution = ResolutionRequestFactory.create(
        work_item=item,
        integration=integration,
        saas_deletions=(C, RequestState.DISPATCHED),
        completed=True,
    )
    assert work_item_settle(work_item=item).status_code is None  # a SaaS deletion is pending

    resolution.saas_deletions.update(state=C)
    assert work_item_settle(work_item=item).status_code == 3

    ResolutionRequestFactory.create(
        work_item=item, integration=integration, drop_outcome="opted_out", completed=True
    )
    assert work_item_settle(work_item=item).status_code == 4


def test_a_pending_resolution_keeps_the_item_open(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, completed=True)
    ResolutionRequestFactory.create(
        work_item=item,
        integration=WebhookIntegrationFactory.create(broker=broker),
        state=RequestState.DISPATCHED,
    )
    assert work_item_settle(work_item=item).state == WorkItemState.OPEN


def test_a_change_is_one_ledger_event_and_a_repeat_writes_none(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, completed=True)

    work_item_settle(work_item=item, actor="api:dpk_abc")
    work_item_settle(work_item=item)

    event = LedgerEvent.objects.get(kind="work_item.status_settled")
    assert event.subject == item.work_item_id
    assert event.broker_id == "4821"
    assert event.actor == "api:dpk_abc"
    assert event.data["status_code"] == 3
    assert event.data["previous_status_code"] is None


def test_a_status_that_changes_after_reporting_needs_an_amendment(broker: Broker) -> None:
    """A late match on a reported 5, as matching leaves it: no status while its request is
    out, flagged for amendment (services.cycle.matching); the answer decides."""
    item = WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=broker),
        status_code=None,
        state=WorkItemState.OPEN,
        needs_amendment=True,
    )
    WorkItem.objects.filter(pk=item.pk).update(
        reported_status_code=5, reported_at="2026-03-13T10:00:00Z"
    )
    request = DeletionRequestFactory.create(
        work_item=item, state=RequestState.DISPATCHED, late_match=True
    )

    waiting = work_item_settle(work_item=item)
    assert (waiting.state, waiting.status_code) == (WorkItemState.OPEN, None)
    assert waiting.reported_status_code == 5  # DROP keeps its 5 meanwhile

    DeletionRequest.objects.filter(pk=request.pk).update(state=C, drop_outcome="deleted")
    amended = work_item_settle(work_item=item)
    assert (amended.state, amended.status_code, amended.needs_amendment) == (
        WorkItemState.REPORTABLE,
        3,
        True,
    )


def test_a_request_still_out_leaves_a_status_drop_holds_as_it_is(broker: Broker) -> None:
    """A consumer matched later to an item DROP holds as 3 (matching leaves a 3 or a 4 as it
    is): while its request is out, settling keeps the 3; a stronger answer is amended."""
    item = WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=broker), status_code=3, state=WorkItemState.REPORTED
    )
    WorkItem.objects.filter(pk=item.pk).update(
        reported_status_code=3, reported_at="2026-03-13T10:00:00Z"
    )
    DeletionRequestFactory.create(work_item=item, drop_outcome="deleted")
    late = DeletionRequestFactory.create(
        work_item=item, state=RequestState.DISPATCHED, late_match=True
    )

    waiting = work_item_settle(work_item=item)
    assert (waiting.state, waiting.status_code, waiting.needs_amendment) == (
        WorkItemState.REPORTED,
        3,
        False,
    )

    DeletionRequest.objects.filter(pk=late.pk).update(state=C, drop_outcome="opted_out")
    amended = work_item_settle(work_item=item)
    assert (amended.state, amended.status_code, amended.needs_amendment) == (
        WorkItemState.REPORTABLE,
        4,
        True,
    )


def test_the_same_code_after_reporting_needs_no_amendment(broker: Broker) -> None:
    item = WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=broker), status_code=5, state=WorkItemState.REPORTED
    )
    WorkItem.objects.filter(pk=item.pk).update(
        reported_status_code=5, reported_at="2026-03-13T10:00:00Z"
    )
    DeletionRequestFactory.create(work_item=item, drop_outcome="not_found", late_match=True)

    settled = work_item_settle(work_item=item)

    assert (settled.state, settled.needs_amendment) == (WorkItemState.REPORTED, False)


def test_removed_items_are_left_alone(broker: Broker) -> None:
    item = WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=broker), state=WorkItemState.REMOVED
    )
    DeletionRequestFactory.create(work_item=item, completed=True)
    assert work_item_settle(work_item=item).state == WorkItemState.REMOVED
    assert not LedgerEvent.objects.filter(kind="work_item.status_settled").exists()


def test_an_unmatched_item_is_left_to_matching(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    assert work_item_settle(work_item=item).status_code is None


# ---------------------------------------------------------------- staff


def test_staff_set_a_status_with_a_reason(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, failed=True)

    updated = work_item_status_set(
        work_item=item, status_code=5, reason="Broker confirmed by phone", actor="staff:alice"
    )

    assert (updated.state, updated.status_code) == (WorkItemState.REPORTABLE, 5)
    event = LedgerEvent.objects.get(kind="work_item.status_set")
    assert event.actor == "staff:alice"
    assert event.data["reason"] == "Broker confirmed by phone"


def test_the_same_status_and_reason_again_changes_nothing(broker: Broker) -> None:
    """A double submit, or two staff setting the same: one change, one ledger event."""
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, failed=True)
    first = work_item_status_set(work_item=item, status_code=3, reason="seen", actor="staff:al")

    again = work_item_status_set(work_item=item, status_code=3, reason="seen", actor="staff:bo")

    assert again.updated_at == first.updated_at
    assert LedgerEvent.objects.filter(kind="work_item.status_set").count() == 1
    work_item_status_set(work_item=item, status_code=3, reason="seen twice", actor="staff:bo")
    assert LedgerEvent.objects.filter(kind="work_item.status_set").count() == 2  # a new reason


@pytest.mark.parametrize(
    ("status_code", "reason", "message"),
    [(5, "   ", "reason"), (1, "because", "status_code"), (None, "because", "status_code")],
)
def test_staff_status_needs_a_reason_and_a_valid_code(
    broker: Broker, status_code: int | None, reason: str, message: str
) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    with pytest.raises(ValidationError) as error:
        work_item_status_set(
            work_item=item,
            status_code=status_code,  # type: ignore[arg-type]
            reason=reason,
            actor="staff:alice",
        )
    assert message in error.value.message_dict
    assert WorkItem.objects.get(pk=item.pk).status_code is None
    assert not LedgerEvent.objects.filter(kind="work_item.status_set").exists()


def test_staff_cannot_set_a_status_on_a_removed_item(broker: Broker) -> None:
    item = WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=broker), state=WorkItemState.REMOVED
    )
    with pytest.raises(ValidationError, match="no status is owed"):
        work_item_status_set(work_item=item, status_code=5, reason="x", actor="staff:alice")


def test_a_staff_status_stands_until_every_request_is_final(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    failed = DeletionRequestFactory.create(work_item=item, failed=True)
    # The settlement's ledger event is written in SQL, with the reason in it: any text.
    reason = 'deadline: "CRM" down \\ retry\n\tété \x01 😀'
    work_item_status_set(work_item=item, status_code=5, reason=reason, actor="staff:alice")

    assert work_item_settle(work_item=item).status_code == 5  # still failed: staff's 5 stands

    DeletionRequest.objects.filter(pk=failed.pk).update(
        state=C, drop_outcome="deleted", completed_at=timezone.now()
    )
    settled = work_item_settle(work_item=item)
    assert (settled.status_code, settled.status_reason) == (3, "")
    event = LedgerEvent.objects.get(kind="work_item.status_settled")
    assert event.data == {
        "cycle": item.cycle.drop_session_id,
        "status_code": 3,
        "previous_status_code": 5,
        "state": WorkItemState.REPORTABLE,
        "needs_amendment": False,
        "replaced_staff_status": {"status_code": 5, "reason": reason},
    }
    assert ledger_verify().ok


def test_a_staff_status_set_once_all_was_final_gives_way_only_to_a_later_outcome(
    broker: Broker,
) -> None:
    """Deleted and reported 3, then a legal hold found: staff set 2. A recurring round's
    answer settles the item again and must leave it; a consumer matched since, answering
    after, decides as any outcome of the match does."""
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(
        work_item=item,
        drop_outcome="deleted",
        completed_at=timezone.now() - dt.timedelta(days=46),
    )
    work_item_settle(work_item=item)
    WorkItem.objects.filter(pk=item.pk).update(
        state=WorkItemState.REPORTED, reported_status_code=3, reported_at=timezone.now()
    )
    work_item_status_set(work_item=item, status_code=2, reason="legal hold", actor="staff:alice")
    round_one = DeletionRequestFactory.create(
        work_item=item, round=1, state=RequestState.DISPATCHED
    )

    deletion_outcome_record(deletion_request=round_one, drop_outcome="deleted", actor="t")

    item.refresh_from_db()
    assert (item.status_code, item.status_reason, item.needs_amendment) == (2, "legal hold", True)
    settled = LedgerEvent.objects.filter(kind="work_item.status_settled")
    assert settled.count() == 1  # the match's, to 3: the round's answer settled nothing

    late = DeletionRequestFactory.create(
        work_item=item, late_match=True, state=RequestState.DISPATCHED
    )
    deletion_outcome_record(deletion_request=late, drop_outcome="opted_out", actor="t")

    item.refresh_from_db()
    assert (item.status_code, item.status_reason, item.status_set_at) == (4, "", None)
    event = LedgerEvent.objects.filter(kind="work_item.status_settled").latest("pk")
    assert event.data["replaced_staff_status"] == {"status_code": 2, "reason": "legal hold"}


def test_staff_status_on_a_reported_item_is_an_amendment(broker: Broker) -> None:
    item = WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=broker), status_code=5, state=WorkItemState.REPORTED
    )
    WorkItem.objects.filter(pk=item.pk).update(
        reported_status_code=5, reported_at="2026-03-13T10:00:00Z"
    )
    updated = work_item_status_set(
        work_item=item, status_code=2, reason="exempt: GLBA", actor="staff:alice"
    )
    assert (updated.state, updated.needs_amendment) == (WorkItemState.REPORTABLE, True)


# ---------------------------------------------------------------- a whole cycle


def test_settling_a_cycle_catches_items_whose_outcomes_all_arrived(broker: Broker) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    done = WorkItemFactory.create(cycle=cycle)
    DeletionRequestFactory.create(work_item=done, drop_outcome="opted_out")
    waiting = WorkItemFactory.create(cycle=cycle)
    DeletionRequestFactory.create(work_item=waiting, drop_outcome="deleted")
    DeletionRequestFactory.create(work_item=waiting, state=RequestState.DISPATCHED)
    unmatched = WorkItemFactory.create(cycle=cycle)

    assert work_items_settle(cycle=cycle) == 1

    states = dict(WorkItem.objects.values_list("pk", "status_code"))
    assert states == {done.pk: 4, waiting.pk: None, unmatched.pk: None}


def test_settling_many_items_goes_by_batches_and_counts_each_once(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work_items_module, "_SETTLE_BATCH", 2)
    cycle = DropCycleFactory.create(broker=broker)
    done = WorkItemFactory.create_batch(3, cycle=cycle)
    for item in done:
        DeletionRequestFactory.create(work_item=item, drop_outcome="deleted")
    waiting = WorkItemFactory.create(cycle=cycle)
    DeletionRequestFactory.create(work_item=waiting, state=RequestState.DISPATCHED)

    items = sorted([waiting.pk, *(item.pk for item in done)])
    assert work_items_settle_by_id(items=items, actor="test") == 3
    with pytest.raises(WorkItem.DoesNotExist):  # as one by one: not skipped unseen
        work_items_settle_by_id(items=[0], actor="test")

    states = dict(WorkItem.objects.values_list("pk", "status_code"))
    assert states == {**{item.pk: 3 for item in done}, waiting.pk: None}
    settled = LedgerEvent.objects.filter(kind=LedgerKind.WORK_ITEM_STATUS_SETTLED)
    assert sorted(settled.values_list("subject", flat=True)) == sorted(
        item.work_item_id for item in done
    )
