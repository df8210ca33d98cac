"""A DROP cycle's progress for its own page: its days, today, and the statuses it owes.

One GROUP BY over the cycle's work items (the (cycle, state) index)::

    progress = cycle_progress(cycle=cycle, today=drop_today)
    progress.known, progress.reported, progress.owed, progress.day, progress.span
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Count

from integrations.models import DropCycle, WorkItem
from integrations.selectors.dashboard import CycleWorkItems


@dataclass(frozen=True)
class CycleProgress:
    items: CycleWorkItems
    start: dt.date
    today: dt.date

    @property
    def span(self) -> int:
        return (self.items.cycle.due_date - self.start).days

    @property
    def day(self) -> int:
        """Today's day of the cycle (0 on the download's day; past ``span`` when overdue)."""
        return (self.today - self.start).days

    @property
    def days_left(self) -> int:
        return (self.items.cycle.due_date - self.today).days

    @property
    def known(self) -> int:
        """Work items whose DROP status is known (reported or ready to report)."""
        return self.items.with_status

    @property
    def reported(self) -> int:
        return self.items.reported

    @property
    def owed(self) -> int:
        """Work items still owing DROP a status (not reported, not removed)."""
        return self.items.owed - self.items.reported


def cycle_progress(*, cycle: DropCycle, start: dt.date, today: dt.date) -> CycleProgress:
    counts = {
        (row["state"], row["status_code"]): row["n"]
        for row in WorkItem.objects.filter(cycle=cycle)
        .values("state", "status_code")
        .annotate(n=Count("id"))
        .order_by()
    }
    return CycleProgress(CycleWorkItems(cycle, counts), start=start, today=today)
