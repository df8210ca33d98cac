"""DROP's calendar: the dates DROP counts in are California's, not UTC's.

A match date, a due date, the days left and a year of DROP figures are days of
``settings.DROPPORTAL_DROP_TIMEZONE`` (``America/Los_Angeles`` by default); stored and exported
timestamps stay UTC. A download at 22:30 Pacific on November 25 (06:30 UTC on the 26th) is
matched on November 25::

    drop_today()                       # today in DROP's calendar
    drop_date(cycle.downloaded_at)     # the DROP day of a moment
    drop_year_bounds(2026)             # the year's first and last moments, as aware datetimes
    drop_day_bounds(date(2026, 7, 1))  # the day's, likewise (07:00 UTC to 07:00 UTC in July)
    drop_time_text(integration.retired_at)  # "2026-11-25 22:30 PST", for a message to staff
    drop_clock_text(counts.counted_at)      # "22:30 PST", for a moment of DROP's today
    drop_moment("2026-11-25 22:30")    # a moment staff typed, read in DROP's zone (UTC out)
    day.year in DROP_YEARS             # a date staff gave is one we can compute with
"""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

# Below the models, which name their times with it too; said here with the rest.
from integrations.drop_zone import drop_clock_text, drop_time_text, drop_timezone

__all__ = [
    "DROP_YEARS",
    "drop_clock_text",
    "drop_date",
    "drop_day_bounds",
    "drop_midnight",
    "drop_moment",
    "drop_time_text",
    "drop_timezone",
    "drop_today",
    "drop_year_bounds",
]

# The years staff may name as DROP dates (a form, a list filter, a command's --year): DROP
# began long after 2000, and 9998 keeps the end of a day or a year, moved to UTC, within the
# dates Python holds (the day after 9999-12-31 does not exist).
DROP_YEARS = range(2000, 9999)


def drop_date(moment: dt.datetime) -> dt.date:
    """The day ``moment`` (an aware datetime) falls on in DROP's calendar."""
    return moment.astimezone(drop_timezone()).date()


def drop_today(now: dt.datetime | None = None) -> dt.date:
    """Today in DROP's calendar (the day of ``now`` when given)."""
    return drop_date(now or timezone.now())


def drop_midnight(day: dt.date) -> dt.datetime:
    """The first moment of ``day`` in DROP's calendar (aware; a comparison with a stored UTC
    timestamp is exact). Every range of DROP days starts and ends at one of these."""
    return dt.datetime.combine(day, dt.time(), tzinfo=drop_timezone())


def drop_year_bounds(year: int) -> tuple[dt.datetime, dt.datetime]:
    """The first moment of ``year`` and of the next one in DROP's calendar."""
    return drop_midnight(dt.date(year, 1, 1)), drop_midnight(dt.date(year + 1, 1, 1))


def drop_day_bounds(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """The first moment of ``day`` and of the next one in DROP's calendar (23 or 25 hours
    apart on the days the clocks change)."""
    return drop_midnight(day), drop_midnight(day + dt.timedelta(days=1))


def drop_moment(text: str, *, end: bool = False) -> dt.datetime:
    """A moment staff typed (a command's option, an admin form's field), in UTC: a date is a
    day of DROP's calendar (from its midnight there; ``end``: the next day's, so a bound
    takes in the whole day), an ISO time without an offset is read there too. A text with no
    time part is a date, in any ISO form (``20261231`` too, which
    ``datetime.fromisoformat`` would read as that day's midnight). Raises ``ValueError``
    for a text that is neither, or a time Python cannot hold once moved to UTC."""
    try:
        try:
            day = dt.date.fromisoformat(text)
        except ValueError:
            # Capitals: RFC 3339 allows a lowercase t and z, which Python refuses.
            moment = dt.datetime.fromisoformat(text.upper())
        else:
            start, next_day = drop_day_bounds(day)
            moment = next_day if end else start
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=drop_timezone())
        return moment.astimezone(dt.UTC)
    except OverflowError as exc:
        raise ValueError(str(exc)) from None
