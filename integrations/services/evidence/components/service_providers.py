"""Service providers and contractors: the signed directives of the pack's time, per provider,
their delivery and acknowledgement; tested for acknowledgements in time
(``DROPPORTAL_DIRECTIVE_ACK_DAYS``) and for each directive's CSV still being what was signed."""

from __future__ import annotations

import hashlib
from typing import Any

from cryptography.exceptions import InvalidSignature
from django.conf import settings
from django.db import connection
from django.db.models import Count, FilteredRelation, Q

from integrations.evidence import pack
from integrations.evidence.directives import directive_verify
from integrations.evidence.signing_key import evidence_signing_key
from integrations.ledger_kinds import LedgerKind
from integrations.models import Directive, LedgerEvent, ServiceProvider, WorkItemState
from integrations.selectors.directives import (
    directive_acknowledged_late,
    directives_ack_overdue_before,
)
from integrations.services.evidence.components.base import Component, PackContext

# Per provider, the work items matched in the pack's time (a request of DROP's, round 0,
# matched once the provider was registered; not removed since) whose hash is in none of its
# directives: each match directs every provider in the transaction that matched.
_UNDIRECTED = """
WITH directed AS MATERIALIZED (
    SELECT d.provider_id, split_part(t.line, ',', 1) AS hash_type,
           split_part(t.line, ',', 2) AS hash
      FROM integrations_directive d
     CROSS JOIN LATERAL string_to_table(convert_from(d.content, 'UTF8'), E'\n')
           WITH ORDINALITY AS t(line, n)
     WHERE d.broker_id = %(broker)s AND d.created_at >= %(start)s AND t.n > 1 AND t.line <> ''
), matched AS MATERIALIZED (
    SELECT work_item_id, min(matched_at) AS matched_at
      FROM integrations_deletionrequest
     WHERE broker_id = %(broker)s AND round = 0 AND canary_round_id IS NULL
       AND work_item_id IS NOT NULL AND matched_at >= %(start)s AND matched_at < %(end)s
     GROUP BY work_item_id
)
SELECT p.id, count(*)
  FROM integrations_serviceprovider p
  JOIN matched m ON m.matched_at >= p.created_at
  JOIN integrations_workitem w ON w.id = m.work_item_id AND w.state <> %(removed)s
 WHERE p.broker_id = %(broker)s
   AND NOT EXISTS (SELECT 1 FROM directed x
                    WHERE x.provider_id = p.id AND x.hash_type = w.hash_type
                      AND x.hash = translate(encode(w.hash, 'base64'), E'\n', ''))
 GROUP BY p.id
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
    params: dict[str, Any] = {"broker": context.broker.pk, "start": start, "end": end}
    # Per provider of the broker: its directives issued in the pack's time, delivered to its
    # S3 prefix, acknowledged, acknowledged late, unacknowledged past the due time; one
    # query, by the rules of selectors.directives.
    overdue_before = directives_ack_overdue_before(now=context.exported_at)
    rows = (
        ServiceProvider.objects.filter(broker=context.broker)
        .alias(
            issued=FilteredRelation(
                "directives",
                condition=Q(directives__created_at__gte=start, directives__created_at__lt=end),
            )
        )
        .annotate(
            n_issued=Count("issued"),
            n_delivered=Count("issued", filter=Q(issued__delivered_at__isnull=False)),
            n_acknowledged=Count("issued", filter=Q(issued__acknowledged_at__isnull=False)),
            n_late=Count("issued", filter=directive_acknowledged_late("issued__")),
            n_overdue=Count(
                "issued",
                filter=Q(
                    issued__acknowledged_at__isnull=True, issued__created_at__lt=overdue_before
                ),
            ),
        )
        .order_by("name")
        .values_list(
            "pk",
            "name",
            "s3_prefix",
            "n_issued",
            "n_delivered",
            "n_acknowledged",
            "n_late",
            "n_overdue",
        )
    )
    with connection.cursor() as cursor:
        cursor.execute(_UNDIRECTED, {**params, "removed": WorkItemState.REMOVED.value})
        undirected = dict(cursor.fetchall())
    altered, other_key = _signatures_checked(context)
    providers: list[dict[str, Any]] = [
        {
            "provider": name,
            "delivery": "s3" if s3_prefix else "download",
            "directives": issued,
            "delivered_to_s3": delivered,
            "acknowledged": acknowledged,
            "acknowledged_late": late,
            "unacknowledged_overdue": overdue,
            "not_as_signed": altered.get(provider_id, 0),
            "signed_by_another_key": other_key.get(provider_id, 0),
            "matched_not_directed": int(undirected.get(provider_id, 0)),
        }
        for provider_id, name, s3_prefix, issued, delivered, acknowledged, late, overdue in rows
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
    not_directed = [p for p in providers if p["matched_not_directed"]]
    component.test(
        "every match of the pack's time directed to every provider",
        passed=not not_directed,
        detail="; ".join(
            f"{p['provider']}: {p['matched_not_directed']} matched work item(s) in no "
            "directive to it"
            for p in not_directed
        )
        or f"each matched work item is in a directive to each of {len(providers)} provider(s)",
    )
    not_as_signed = sum(p["not_as_signed"] for p in providers)
    unchecked = sum(p["signed_by_another_key"] for p in providers)
    component.test(
        "every directive's CSV is still the one signed",
        passed=not_as_signed == 0,
        detail=(
            f"{not_as_signed} directive(s) whose CSV does not verify against its signature"
            if not_as_signed
            else "each CSV verifies against its signature by the evidence key"
        )
        + (
            f"; {unchecked} signed by another key: their CSV checked against their digest only"
            if unchecked
            else ""
        ),
    )
    return component


def _signatures_checked(context: PackContext) -> tuple[dict[int, int], dict[int, int]]:
    """Per provider, its directives of the pack's time whose stored CSV no longer verifies
    against the signature issued with it, and those signed by a key other than today's
    evidence key (only their digest can be checked here). The digest alone proves nothing:
    whoever rewrites a CSV in the database can rewrite its digest beside it; so the digest and
    the key must also be those of the directive's ``directive.issued`` event (none: altered)."""
    start, end = context.window
    public = evidence_signing_key().public_key()
    fingerprint = pack.key_fingerprint(public)
    altered: dict[int, int] = {}
    other_key: dict[int, int] = {}
    directives = Directive.objects.filter(
        broker=context.broker, created_at__gte=start, created_at__lt=end
    ).order_by("pk")
    # What each directive.issued event (in the sealed chain) says was signed: the digest and
    # key stored beside the CSV can be rewritten with it, and naming another key would turn
    # "does not verify" into "signed by another key, its digest checked".
    issued: dict[str, tuple[str | None, str | None]] = {}
    for subject, issued_sha256, issued_key in (
        LedgerEvent.objects.filter(
            broker_id=context.broker.broker_id,
            kind=LedgerKind.DIRECTIVE_ISSUED,
            subject__in=[str(pk) for pk in directives.values_list("pk", flat=True)],
        )
        .order_by("id")
        .values_list("subject", "data__sha256", "data__key_fingerprint")
    ):
        issued.setdefault(subject, (issued_sha256, issued_key))
    rows = directives.values_list(
        "pk", "provider_id", "content", "sha256", "signature", "key_fingerprint"
    )
    # A directive's CSV may hold a million hashes: a few at a time.
    for pk, provider_id, content, sha256, signature, key_fingerprint in rows.iterator(
        chunk_size=20
    ):
        content = bytes(content)
        as_issued = issued.get(str(pk)) == (sha256, key_fingerprint)
        intact = as_issued and hashlib.sha256(content).hexdigest() == sha256
        if intact and key_fingerprint != fingerprint:
            other_key[provider_id] = other_key.get(provider_id, 0) + 1
            continue
        if intact:
            try:
                directive_verify(public, content, f"{signature}\n".encode("ascii"))
            except (InvalidSignature, ValueError, UnicodeEncodeError):
                intact = False
        if not intact:
            altered[provider_id] = altered.get(provider_id, 0) + 1
    return altered, other_key
