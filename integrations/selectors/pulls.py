"""Which brokers the periodic DROP jobs serve: those due for a pull (not those whose key
DROP refused), and those reported for automatically."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import (
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Func,
    IntegerField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Least

from integrations.drop.calendar import drop_date, drop_midnight
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropCycle, LedgerEvent

# DROP answers a refused key with 401: retrying cannot help until staff change the key or the
# URL it is sent to. Its 403 (broker not eligible, or no list selected) is not one: the broker
# fixes that in DROP's portal, which then notifies ``download.ready``, so pulls go on.
DROP_KEY_REFUSED_STATUS = 401
# What changes the key DROP sees: the key itself, the base URL, or the mode (its default URL).
_DROP_ACCESS_FIELDS = ["drop_api_key", "drop_base_url", "mode"]


def drop_pulls_reached(events: QuerySet[LedgerEvent] | None = None) -> QuerySet[LedgerEvent]:
    """The ``drop.pulled`` events of pulls that reached DROP, whether it had something new or
    not: not those that resumed a package an earlier pull downloaded (``resumed``), which
    never asked DROP anything (that package's cycle keeps its download time). The one rule
    of the schedule's refused key, the dashboard's next download and the evidence pack.

    Annotated with ``reached_at``: when the pull started (``started_at``, recorded since
    pulls kept it), the time DROP dates it by; the event itself is written when the pull
    ends, minutes of waiting and streaming later, perhaps on the next day."""
    events = events if events is not None else LedgerEvent.objects.all()
    return (
        events.filter(kind=LedgerKind.DROP_PULLED)
        .exclude(data__contains={"resumed": True})
        .annotate(
            reached_at=Coalesce(Cast(KT("data__started_at"), DateTimeField()), F("created_at"))
        )
    )


def brokers_with_last_downloads(brokers: QuerySet[Broker] | None = None) -> QuerySet[Broker]:
    """Brokers annotated with ``last_download_at`` (their latest package imported, pulled or
    uploaded by hand) and ``last_pull_reached_at`` (their latest pull DROP answered,
    ``drop_pulls_reached``, "nothing new" included)."""
    brokers = brokers if brokers is not None else Broker.objects.all()
    return brokers.annotate(
        last_download_at=Max("cycles__downloaded_at"),
        last_pull_reached_at=Subquery(
            drop_pulls_reached()
            .filter(broker_id=OuterRef("broker_id"))
            .order_by("-id")
            .values(at=F("reached_at"))[:1]
        ),
    )


# The law's duty to download at least once every 45 days begins on this day of DROP's
# calendar (Civil Code 1798.99.86): no time before it is late, so the cadence's clock
# starts at its first moment in California for a broker set up, or last downloading, before.
DOWNLOAD_DUTY_BEGINS = dt.date(2026, 8, 1)


def download_duty_start() -> dt.datetime:
    """The first moment of the duty to download (``DOWNLOAD_DUTY_BEGINS``) in DROP's zone."""
    return drop_midnight(DOWNLOAD_DUTY_BEGINS)


def download_clock_from(moment: dt.datetime) -> dt.datetime:
    """When DROP's cadence counts from after ``moment`` (a download, or the broker's set-up
    in the service before a first): ``moment``, or the first moment of the duty
    (``DOWNLOAD_DUTY_BEGINS``) if later. The one rule of the dashboard, the
    ``drop_download_due`` alert and the evidence pack's gaps."""
    return max(moment, download_duty_start())


def download_clock_from_sql(moment: str) -> str:
    """``download_clock_from`` of the SQL expression ``moment`` (the duty's start bound in
    the text), for a query that measures every gap between downloads at once."""
    # compose_sql: PostgreSQL's operations only (the stubs know the base class).
    return connection.ops.compose_sql(  # type: ignore[attr-defined,no-any-return]
        f"greatest({moment}, %s)", [download_duty_start()]
    )


def download_due_date(*downloads: dt.datetime | None, set_up: dt.datetime) -> dt.date:
    """The day DROP's cadence wants the next download by, counted in DROP's calendar from the
    last of ``downloads`` (as ``brokers_with_last_downloads`` annotates them, and as the
    evidence pack counts them); before the first, from the broker's ``set_up`` in the
    service, as the pack counts the time before a first download too: a broker that never
    pulled is not exempt from the law. Never from before the duty began
    (``download_clock_from``)."""
    last = max((at for at in downloads if at is not None), default=set_up)
    return drop_date(download_clock_from(last)) + dt.timedelta(
        days=settings.DROPPORTAL_DOWNLOAD_CADENCE_DAYS
    )


def brokers_download_due(*, today: dt.date, within_days: int) -> list[tuple[Broker, dt.date]]:
    """Each broker whose next download is due within ``within_days`` of ``today`` (or
    overdue), with that day, whether it pulls automatically or by hand."""
    due = []
    for broker in brokers_with_last_downloads().order_by("broker_id"):
        day = download_due_date(
            broker.last_download_at,  # type: ignore[attr-defined]
            broker.last_pull_reached_at,  # type: ignore[attr-defined]
            set_up=broker.created_at,
        )
        if (day - today).days <= within_days:
            due.append((broker, day))
    return due


def _last_event_id(**filters: Any) -> Subquery:
    events = LedgerEvent.objects.filter(broker_id=OuterRef("broker_id"), **filters)
    return Subquery(events.order_by("-id").values("id")[:1])


def brokers_with_drop_key_refused(
    brokers: QuerySet[Broker] | None = None,
) -> QuerySet[Broker]:
    """Brokers whose last word from DROP on a pull is a refused key (401), with no change of
    their DROP key, base URL or mode, no successful pull that reached DROP
    (``drop_pulls_reached``) and no 403 since (a 403 means DROP took the key); annotated
    with ``drop_key_refused_event`` (the ``drop.pull_failed`` ledger event's id)."""
    brokers = brokers if brokers is not None else Broker.objects.all()
    refused = _last_event_id(kind=LedgerKind.DROP_PULL_FAILED, data__status=DROP_KEY_REFUSED_STATUS)
    pulled = Subquery(
        drop_pulls_reached()
        .filter(broker_id=OuterRef("broker_id"))
        .order_by("-id")
        .values("id")[:1]
    )
    forbidden = _last_event_id(kind=LedgerKind.DROP_PULL_FAILED, data__status=403)
    changed = _last_event_id(
        kind=LedgerKind.BROKER_UPDATED, data__changes__has_any_keys=_DROP_ACCESS_FIELDS
    )
    return (
        brokers.annotate(
            drop_key_refused_event=refused,
            drop_key_cleared_event=Coalesce(
                Func(pulled, changed, forbidden, function="GREATEST"), Value(0)
            ),
        )
        .filter(drop_key_refused_event__isnull=False)
        .filter(drop_key_refused_event__gt=F("drop_key_cleared_event"))
    )


def brokers_due_for_pull(*, now: dt.datetime) -> QuerySet[Broker]:
    """Brokers whose auto-pull is on and whose last pull is ``pull_interval_days`` old (or
    who never pulled), for the periodic pull job. A broker without a DROP API key is
    included: its pull fails into the ledger, where staff see it. A broker whose DROP key
    was refused, a 401 (``brokers_with_drop_key_refused``), is not: asking again every hour
    with the same key cannot help, and the dashboard shows why. After a 403 it is: the broker
    may have become eligible or selected a list in DROP's portal since."""
    refused = brokers_with_drop_key_refused().values("pk")
    return _pull_due(
        Broker.objects.filter(auto_pull=True).exclude(pk__in=refused), now=now
    ).order_by("broker_id")


def broker_pull_due(broker: Broker, *, now: dt.datetime) -> bool:
    """Whether ``broker``'s last recorded pull is ``pull_interval_days`` old (or missing),
    whatever its auto-pull: a pull that finished a package left by an earlier one asks DROP
    too only then."""
    return _pull_due(Broker.objects.filter(pk=broker.pk), now=now).exists()


def _pull_due(brokers: QuerySet[Broker], *, now: dt.datetime) -> QuerySet[Broker]:
    # Within the cadence as it is now, with a day to spare (``within_download_cadence``):
    # an interval stored before the cadence was shortened, or at the cadence itself, would
    # make the download late.
    cadence = settings.DROPPORTAL_DOWNLOAD_CADENCE_DAYS
    days = Least(F("pull_interval_days"), Value(cadence - 1), output_field=IntegerField())
    interval = ExpressionWrapper(days * dt.timedelta(days=1), output_field=DurationField())
    return brokers.annotate(pull_due_at=F("last_pulled_at") + interval).filter(
        Q(last_pulled_at__isnull=True) | Q(pull_due_at__lte=now)
    )


def brokers_due_for_report() -> list[Broker]:
    """Brokers the periodic report job serves: those with a DROP API key (none when
    ``DROPPORTAL_AUTO_REPORT`` is off), but not one DROP refused (a 401,
    ``brokers_with_drop_key_refused``), as the pulls skip it: sending the same key every
    quarter of an hour cannot help, and the dashboard and an alert say why."""
    if not settings.DROPPORTAL_AUTO_REPORT:
        return []
    refused = brokers_with_drop_key_refused().values("pk")
    # The key is encrypted, so "has a key" is read in Python; brokers are few.
    brokers = Broker.objects.exclude(pk__in=refused).order_by("pk")
    return [broker for broker in brokers if broker.drop_api_key]


def latest_cycle_pk(broker_pk: int) -> int:
    """The pk of the broker's latest cycle (0 when it has none): what a pull job is asked
    with, so that it can tell a package imported since by a pull that ran meanwhile."""
    return DropCycle.objects.filter(broker=broker_pk).aggregate(pk=Max("pk"))["pk"] or 0
