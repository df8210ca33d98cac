"""DROP's zone, and a moment as staff read it there: the part of DROP's calendar
(``integrations.drop.calendar``, which holds the rest and re-exports these) that the models
need too, kept below them so that a model's text says its times the way every message does."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from django.conf import settings


def drop_timezone() -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(settings.DROPPORTAL_DROP_TIMEZONE)


def drop_time_text(moment: dt.datetime) -> str:
    """``moment`` as a message to staff writes it: in DROP's zone, with its abbreviation.

    The admin's pages show their times in that zone; a message (a reason kept with a row, an
    error, a notice, a record's name) says the same time the same way.
    """
    return f"{moment.astimezone(drop_timezone()):%Y-%m-%d %H:%M %Z}"


def drop_clock_text(moment: dt.datetime) -> str:
    """``moment``'s time of day as ``drop_time_text`` writes it, without the date: for a
    moment of DROP's today, where the date goes without saying."""
    return f"{moment.astimezone(drop_timezone()):%H:%M %Z}"
