"""A DROP cycle's progress for its own page: its days, today, and the statuses it owes.

One GROUP BY over the cycle's work items (the (cycle, state) index)::

    progress = cycle_progress(cycle=cycle, today=drop_today)
    progress.known, progress.reported, progress.owed, progress.day, progress.span
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Count

from integrations.models import DropCycle, WorkItem, owed_status
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
        """Work items DROP is still owed a status for (``WorkItem.objects.owed()``)."""
        return self.items.still_owed


def cycle_progress(*, cycle: DropCycle, start: dt.date, today: dt.date) -> CycleProgress:
    rows = list(
        WorkItem.objects.filter(cycle=cycle)
        .values("state", "status_code")
        .annotate(n=Count("id"), owed=Count("id", filter=owed_status()))
        .order_by()
    )
    counts = {(row["state"], row["status_code"]): row["n"] for row in rows}
    still_owed = sum(row["owed"] for row in rows)
    items = CycleWorkItems(cycle, counts, still_owed=still_owed)
    return CycleProgress(items, start=start, today=today)
