"""Service providers and contractors: the signed directives of the pack's time, per provider,
their delivery and acknowledgement; tested for acknowledgements in time
(``DROPPORTAL_DIRECTIVE_ACK_DAYS``) and for each directive's CSV still being what was signed."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import connection

from integrations.services.evidence.components.base import Component, PackContext

# Per provider of the broker: its directives issued in the pack's time, delivered to its S3
# prefix, acknowledged, acknowledged late, unacknowledged past the due time, and those whose
# stored CSV no longer hashes to the digest signed with it (PostgreSQL hashes it in place).
_PER_PROVIDER = """
SELECT p.name, p.s3_prefix <> '', count(d.id),
       count(d.id) FILTER (WHERE d.delivered_at IS NOT NULL),
       count(d.id) FILTER (WHERE d.acknowledged_at IS NOT NULL),
       count(d.id) FILTER (WHERE d.acknowledged_at > d.created_at + %(ack)s),
       count(d.id) FILTER (WHERE d.acknowledged_at IS NULL AND d.created_at + %(ack)s < %(now)s),
       count(d.id) FILTER (WHERE encode(sha256(d.content), 'hex') <> d.sha256)
FROM integrations_serviceprovider p
LEFT JOIN integrations_directive d
  ON d.provider_id = p.id AND d.created_at >= %(start)s AND d.created_at < %(end)s
WHERE p.broker_id = %(broker)s
GROUP BY p.id, p.name, p.s3_prefix ORDER BY p.name
"""


def build(context: PackContext) -> Component:
    start, end = context.window
    ack_days = settings.DROPPORTAL_DIRECTIVE_ACK_DAYS
    component = Component(
        key="service_providers",
        proves=(
            "Which service providers and contractors the broker registered, and for each the "
            "directives of the pack's time (the DROP hashes to delete, signed with the "
            "evidence key), whether each was delivered to its S3 prefix and when and by whom "
            "it was acknowledged; each is a ledger event (directive.issued, .delivered, "
            ".acknowledged)."
        ),
        cannot_prove=(
            "That a provider deleted: its acknowledgement is its own statement (or staff's "
            "record of it), and providers the broker did not register here are not seen."
        ),
    )
    params: dict[str, Any] = {
        "broker": context.broker.pk,
        "start": start,
        "end": end,
        "ack": dt.timedelta(days=ack_days),
        "now": context.exported_at,
    }
    with connection.cursor() as cursor:
        cursor.execute(_PER_PROVIDER, params)
        rows = cursor.fetchall()
    providers = [
        {
            "provider": name,
            "delivery": "s3" if s3 else "download",
            "directives": issued,
            "delivered_to_s3": delivered,
            "acknowledged": acknowledged,
            "acknowledged_late": late,
            "unacknowledged_overdue": overdue,
            "not_as_signed": altered,
        }
        for name, s3, issued, delivered, acknowledged, late, overdue, altered in rows
    ]
    component.records = {
        "providers": providers,
        "directives": sum(p["directives"] for p in providers),
        "acknowledgement_days": ack_days,
    }
    slow = [p for p in providers if p["acknowledged_late"] or p["unacknowledged_overdue"]]
    component.test(
        f"every directive acknowledged within {ack_days} days",
        passed=not slow,
        detail="; ".join(
            f"{p['provider']}: {p['acknowledged_late']} acknowledged late, "
            f"{p['unacknowledged_overdue']} not acknowledged and overdue"
            for p in slow
        )
        or f"{component.records['directives']} directive(s) to {len(providers)} provider(s)",
    )
    altered = sum(p["not_as_signed"] for p in providers)
    component.test(
        "every directive's CSV is still the one signed",
        passed=altered == 0,
        detail=f"{altered} directive(s) whose CSV does not hash to its signed digest"
        if altered
        else "each CSV hashes to the digest signed with it",
    )
    return component
