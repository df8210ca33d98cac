"""A DROP cycle's progress for its own page: its days, today, and the statuses it owes.

One GROUP BY over the cycle's work items (the (cycle, work item id) index)::

    progress = cycle_progress(cycle=cycle, today=drop_today)
    progress.known, progress.reported, progress.owed, progress.day, progress.span
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from integrations.models import DropCycle
from integrations.selectors.dashboard import CycleWorkItems, work_item_counts


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
        """Statuses DROP is still owed (``CycleWorkItems.owed``)."""
        return self.items.owed


def cycle_progress(*, cycle: DropCycle, start: dt.date, today: dt.date) -> CycleProgress:
    counts, still_owed, unreadable_owed = work_item_counts([cycle.pk])
    items = CycleWorkItems(
        cycle,
        counts[cycle.pk],
        still_owed=still_owed[cycle.pk],
        unreadable_owed=unreadable_owed[cycle.pk],
    )
    return CycleProgress(items, start=start, today=today)
