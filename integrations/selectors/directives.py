"""Reading directives: a broker's, and those no provider acknowledged in time::

directives_of(broker)                   # newest first, without their CSV
directive_ack_due_date(directive)       # the last day to acknowledge it, in DROP's calendar
directive_acknowledged_late()           # the same rule in a query, of many at once
directives_overdue(now=now)             # unacknowledged past DROPPORTAL_DIRECTIVE_ACK_DAYS
directives_not_written(now=now)         # an S3 write failing for an hour since issued
directive_as_json(directive)            # what ``drop directives --json`` prints
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db.models import Count, DateField, Func, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce, TruncDate
from django.db.models.lookups import GreaterThan

from integrations.drop.calendar import (
    drop_date,
    drop_day_bounds,
    drop_midnight,
    drop_timezone,
    drop_today,
)
from integrations.models import Broker, Directive


def _ack_days() -> dt.timedelta:
    return dt.timedelta(days=settings.DROPPORTAL_DIRECTIVE_ACK_DAYS)


def directive_ack_due_date(directive: Directive) -> dt.date:
    """The last day the provider may acknowledge it on: ``DROPPORTAL_DIRECTIVE_ACK_DAYS``
    days of DROP's calendar after the day it was issued, as staff count every other
    deadline (not that many times 24 hours, which ends at another hour of another day when
    it is issued late in the evening or the clocks change between)."""
    return drop_date(directive.created_at) + _ack_days()


def directive_acknowledged_late(prefix: str = "") -> Q:
    """``directive_ack_due_date`` in a query: directives acknowledged after their last day.
    ``prefix`` reaches them through a relation (``"directives__"`` from a provider), so
    many providers' directives are counted in one query."""
    zone = drop_timezone()
    due_date = Func(
        TruncDate(f"{prefix}created_at", tzinfo=zone),
        Value(settings.DROPPORTAL_DIRECTIVE_ACK_DAYS),
        template="(%(expressions)s)",
        arg_joiner=" + ",
        output_field=DateField(),
    )
    return Q(GreaterThan(TruncDate(f"{prefix}acknowledged_at", tzinfo=zone), due_date))


def directive_ack_due(directive: Directive) -> dt.datetime:
    """When it is overdue: the end of its last day (``directive_ack_due_date``)."""
    return drop_day_bounds(directive_ack_due_date(directive))[1]


def directives_ack_overdue_before(*, now: dt.datetime) -> dt.datetime:
    """A directive issued before this moment and not acknowledged is overdue at ``now``:
    its last day (``directive_ack_due_date``) is before today."""
    return drop_midnight(drop_today(now) - _ack_days())


def directives_of(broker: Broker) -> QuerySet[Directive]:
    return (
        Directive.objects.filter(broker=broker)
        .select_related("broker", "provider")
        .defer("content")
        .order_by("-created_at", "-id")
    )


def directives_overdue(*, now: dt.datetime, broker: Broker | None = None) -> QuerySet[Directive]:
    """Directives still unacknowledged ``DROPPORTAL_DIRECTIVE_ACK_DAYS`` after they were
    issued, oldest first."""
    rows = Directive.objects.filter(
        acknowledged_at__isnull=True, created_at__lt=directives_ack_overdue_before(now=now)
    )
    if broker is not None:
        rows = rows.filter(broker=broker)
    return rows.select_related("broker", "provider").defer("content").order_by("created_at", "id")


# A write still failing this long after the directive was issued is not one the job's next
# try is likely to mend (its tries wait 4 s, 16 s, 64 s... over about a day): staff look at
# the store or the prefix.
DIRECTIVE_WRITE_ALERT_AFTER = dt.timedelta(hours=1)


def directives_not_written(*, now: dt.datetime) -> QuerySet[Directive]:
    """Directives for a provider with an S3 prefix, not written there, whose last write
    failed, issued ``DIRECTIVE_WRITE_ALERT_AFTER`` ago or more; oldest first."""
    return (
        Directive.objects.filter(s3_uri="", created_at__lt=now - DIRECTIVE_WRITE_ALERT_AFTER)
        .exclude(delivery_error="")
        .exclude(provider__s3_prefix="")
        .select_related("broker", "provider")
        .defer("content")
        .order_by("created_at", "id")
    )


def unacknowledged_directives_count(*, issued_before: dt.datetime | None = None) -> Coalesce:
    """An annotation of ``Broker``: its directives not acknowledged yet (issued before
    ``issued_before``, if given), for the dashboard's one query of brokers."""
    rows = Directive.objects.filter(broker=OuterRef("pk"), acknowledged_at__isnull=True)
    if issued_before is not None:
        rows = rows.filter(created_at__lt=issued_before)
    counted = rows.order_by().values("broker").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted), 0)


def directive_as_json(directive: Directive) -> dict[str, Any]:
    return {
        "id": directive.pk,
        "broker_id": directive.broker.broker_id,
        "provider_id": directive.provider_id,
        "provider": directive.provider.name,
        "reason": directive.reason,
        "created_at": directive.created_at.isoformat(),
        "rows": directive.rows,
        "rows_by_hash_type": directive.rows_by_hash_type,
        "sha256": directive.sha256,
        "key_fingerprint": directive.key_fingerprint,
        "s3_uri": directive.s3_uri or None,
        "delivered_at": directive.delivered_at.isoformat() if directive.delivered_at else None,
        "delivery_error": directive.delivery_error or None,
        "acknowledgement_due": directive_ack_due(directive).isoformat(),
        "acknowledged_at": (
            directive.acknowledged_at.isoformat() if directive.acknowledged_at else None
        ),
        "acknowledged_by": directive.acknowledged_by or None,
        "acknowledgement_reference": directive.acknowledgement_reference or None,
    }
