"""A DROP cycle's own state: ``open`` until DROP holds a status for everything the cycle owes
and has taken every file of it, then ``reported``. Reporting (a file taken, an amendment given
up, a file marked uploaded) and importing (DROP's next package) both ask for it again::

    cycle_state_refresh(cycle=cycle, actor=actor)
    cycle_state_refresh(cycle=cycle, actor=actor, reported_at=uploaded_by_hand_at)
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction

from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    NOT_YET_TAKEN,
    CycleState,
    DropCycle,
    LedgerEvent,
    UnreadableWorkItem,
    WorkItem,
)
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append


def cycle_state_refresh(
    *, cycle: DropCycle, actor: str = SYSTEM_ACTOR, reported_at: dt.datetime | None = None
) -> DropCycle:
    """An open cycle becomes ``reported`` once DROP holds a status for every work item owed
    one (``WorkItem.objects.owed()``) and has every file (none waiting for approval, written
    or refused); the moment DROP holds every status owed while a file is still to take is
    recorded all the same (``drop_cycle.statuses_held``). Its unreadable rows owed a status
    (``UnreadableWorkItem.objects.owed()``, answered by staff in DROP's portal) hold it open
    until DROP sends the broker's next package, which it does only once each has a status.

    ``reported_at``: when DROP got what completes the cycle, when that was before now (a file
    staff uploaded by hand and mark later); either event keeps it, and the due date's verdict
    counts from it rather than from the event's own time."""
    with transaction.atomic():
        locked = DropCycle.objects.select_for_update(of=("self",)).select_related("broker")
        current = locked.get(pk=cycle.pk)
        if current.state != CycleState.OPEN:
            return current
        # A cycle with no outstanding work item owes none: its rows are not read.
        unreported = (
            DropCycle.objects.filter(pk=current.pk).may_have_outstanding().exists()
            and WorkItem.objects.owed().filter(cycle=current).exists()
        ) or UnreadableWorkItem.objects.owed().filter(cycle=current).exists()
        if unreported:
            return current
        if current.report_files.filter(state__in=NOT_YET_TAKEN).exists():
            # Nothing is owed: such a file is an amendment (DROP holds a status already) or
            # holds only rows DROP removed since. The cycle stays open to send it, but its
            # statuses reached DROP now: its deadline is judged by this moment.
            _statuses_held_record(current, actor=actor, reported_at=reported_at)
            return current
        current.state = CycleState.REPORTED
        current.save(update_fields=["state"])
        ledger_event_append(
            kind=LedgerKind.DROP_CYCLE_REPORTED,
            broker_id=current.broker.broker_id,
            subject=current.drop_session_id,
            actor=actor,
            data=_cycle_event_data(current, reported_at),
        )
    cycle.state = current.state
    return current


def _cycle_event_data(cycle: DropCycle, reported_at: dt.datetime | None) -> dict[str, Any]:
    data: dict[str, Any] = {"cycle": cycle.drop_session_id, "due_date": cycle.due_date.isoformat()}
    if reported_at is not None:
        data["reported_at"] = reported_at.astimezone(dt.UTC).isoformat()
    return data


def _statuses_held_record(cycle: DropCycle, *, actor: str, reported_at: dt.datetime | None) -> None:
    """The ``drop_cycle.statuses_held`` event, once per cycle (the cycle is locked)."""
    kind = LedgerKind.DROP_CYCLE_STATUSES_HELD
    broker_id, subject = cycle.broker.broker_id, cycle.drop_session_id
    if LedgerEvent.objects.filter(broker_id=broker_id, kind=kind, subject=subject).exists():
        return
    ledger_event_append(
        kind=kind,
        broker_id=broker_id,
        subject=subject,
        actor=actor,
        data=_cycle_event_data(cycle, reported_at),
    )
