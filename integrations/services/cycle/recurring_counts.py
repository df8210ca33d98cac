"""The dashboard's recurring deletion counts, counted by the worker (``RecurringCounts``).

Reading every broker's schedule (``selectors.recurring.recurring_overviews``) grows with
every deleted consumer, past what the dashboard may wait (docs/benchmarks.md); the worker's
periodic job counts it every 5 minutes and keeps one row per broker, which the dashboard
shows while it is fresh (``recurring_overviews_counted``) and counts live otherwise::

    recurring_counts_store()   # the periodic job: returns how many brokers it counted

Nothing here changes what a count means: these are ``recurring_overviews``'s own.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from integrations.drop.calendar import drop_today
from integrations.models import Broker, RecurringCounts
from integrations.models.recurring import RECURRING_COUNTS
from integrations.selectors.recurring import RecurringOverview, recurring_overviews


def recurring_counts_store(*, now: dt.datetime | None = None) -> int:
    """Count every broker's recurring rounds as of ``now`` (DROP's date of it) and store
    them, a row per broker (zeros for one with no round to count); returns how many. Nothing
    while rounds are off: the dashboard then says so, and counts nothing."""
    days = settings.DROPPORTAL_RECURRING_DAYS
    if days <= 0:
        return 0
    now = now or timezone.now()
    today = drop_today(now)
    # Listed before the read: a broker added while it runs was not counted, and gets no row
    # (the dashboard counts live until the next run).
    counted = set(Broker.objects.values_list("pk", flat=True))
    overviews = recurring_overviews(today=today)
    none = RecurringOverview(days, 0, 0, 0, 0, 0)
    with transaction.atomic():
        # And again after it: a broker deleted meanwhile (its row goes with it) is left out,
        # not inserted against a missing broker.
        brokers = sorted(counted & set(Broker.objects.values_list("pk", flat=True)))
        rows = [
            RecurringCounts(
                broker_id=pk,
                counted_for=today,
                counted_at=now,
                **{name: getattr(overviews.get(pk, none), name) for name in RECURRING_COUNTS},
            )
            for pk in brokers
        ]
        RecurringCounts.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["broker"],
            update_fields=[*RECURRING_COUNTS, "counted_for", "counted_at"],
        )
    return len(brokers)
