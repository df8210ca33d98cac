"""Directives to service providers and contractors: who must delete which consumers.

After every match (a DROP cycle imported, consumers registered later that match) and every
recurring round, each service provider of the broker gets a directive: the DROP hashes of
the consumers to delete as a CSV (``integrations.evidence.directives``), signed with the
evidence key, ledgered with its digest and counts, and written to the provider's S3 prefix
by a job (or downloaded from the admin, ``drop directive ID --out FILE``)::

    directives_issue(broker=broker, work_items=[12, 13], reason=DirectiveReason.RECURRING,
                     actor="system")                        # ids, or a relation with a
                                                            # work_item_id column
    directive_acknowledge(directive=d, reference="ticket 88", actor="staff:alice")

The CSV's bytes are kept with the directive, not made again from its work items: what was
signed is what staff download years later, and it still verifies whatever became of the
work items (a removal, a purge) since. The CSV holds hashes only, as DROP sent them.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from integrations import enqueue
from integrations.consumers.sources import SourceError, s3_object_put
from integrations.evidence import pack
from integrations.evidence.directives import directive_csv, directive_sign
from integrations.evidence.signing_key import evidence_signing_key
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    Directive,
    DirectiveReason,
    ServiceProvider,
    WorkItemState,
)
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append
from integrations.validators import has_control_characters

REFERENCE_MAX = 500

# The DROP hashes of the work items named, once each, in a fixed order (the CSV is signed).
# PostgreSQL's Base64 breaks lines every 76 characters; DROP's hashes are shorter, but a
# break would split a row. Sorted by their bytes ("C"), not by the database's collation (an
# en-US one puts "a" before "B"): the same hashes make the same CSV on every deployment.
_HASHES = sql.SQL("""
SELECT DISTINCT w.hash_type COLLATE "C",
       translate(encode(w.hash, 'base64'), E'\\n', '') COLLATE "C"
  FROM integrations_workitem w
 WHERE w.broker_id = %(broker)s AND w.state <> %(removed)s AND {named}
 ORDER BY 1, 2
""")


def directives_issue(
    *,
    broker: Broker,
    work_items: Sequence[int] | sql.Composable,
    reason: DirectiveReason,
    actor: str = SYSTEM_ACTOR,
) -> list[Directive]:
    """One signed directive per service provider of ``broker`` for the DROP hashes of
    ``work_items``: a list of work item ids, or a relation (``sql.Identifier``) with a
    ``work_item_id`` column, such as the matching's ``drop_matches``. Work items DROP
    removed are left out; nothing to delete, or no provider, issues nothing.

    Runs in the caller's transaction (a match issues its directives in the one that matched)
    or its own; each directive is a ``directive.issued`` event, and one with an S3 prefix
    is written there by a job queued in the same transaction.
    """
    providers = list(ServiceProvider.objects.filter(broker=broker).order_by("pk"))
    if not providers:
        return []
    named: sql.Composable
    params: dict[str, Any] = {}
    if isinstance(work_items, sql.Composable):
        named = sql.SQL("w.id IN (SELECT work_item_id FROM {})").format(work_items)
    else:
        named = sql.SQL("w.id = ANY(%(ids)s)")
        params["ids"] = list(work_items)
    with connection.cursor() as cursor:
        cursor.execute(
            _HASHES.format(named=named),
            {"broker": broker.pk, "removed": WorkItemState.REMOVED, **params},
        )
        rows = [(str(hash_type), str(value)) for hash_type, value in cursor.fetchall()]
    if not rows:
        return []
    content = directive_csv(rows)
    key = evidence_signing_key()
    signature = directive_sign(key, content).decode("ascii").strip()
    signed = {
        "sha256": hashlib.sha256(content).hexdigest(),
        "signature": signature,
        "key_fingerprint": pack.key_fingerprint(key),
        "rows": len(rows),
        "rows_by_hash_type": dict(sorted(Counter(h for h, _ in rows).items())),
    }
    issued = []
    with transaction.atomic():
        for provider in providers:
            directive = Directive.objects.create(
                broker=broker, provider=provider, reason=reason, content=content, **signed
            )
            ledger_event_append(
                kind=LedgerKind.DIRECTIVE_ISSUED,
                broker_id=broker.broker_id,
                subject=str(directive.pk),
                actor=actor,
                data={
                    "provider": provider.name,
                    "provider_id": provider.pk,
                    "reason": str(reason),
                    "sha256": signed["sha256"],
                    "rows": signed["rows"],
                    "rows_by_hash_type": signed["rows_by_hash_type"],
                    "key_fingerprint": signed["key_fingerprint"],
                    "delivery": "s3" if provider.s3_prefix else "download",
                },
            )
            if provider.s3_prefix:
                enqueue.directive_deliver_enqueue(directive.pk)
            issued.append(directive)
    return issued


def directive_s3_uri(directive: Directive) -> str:
    return f"{directive.provider.s3_prefix}{directive.file_name}"


def directives_write_again(*, directives: Any, actor: str) -> int:
    """Queue the S3 write again for those of ``directives`` whose provider has a prefix and
    that are not written yet (the job's own retries spent, or the store fixed since): a
    ``directive.write_queued`` event each, by ``actor``; the write's outcome is its own event,
    as the first time. Returns how many were queued."""
    pending = directives.filter(s3_uri="").exclude(provider__s3_prefix="")
    queued = 0
    for directive in pending.select_related("broker").order_by("pk"):
        with transaction.atomic():
            ledger_event_append(
                kind=LedgerKind.DIRECTIVE_WRITE_QUEUED,
                broker_id=directive.broker.broker_id,
                subject=str(directive.pk),
                actor=actor,
                data={"s3_uri": directive_s3_uri(directive), "error": directive.delivery_error},
            )
            enqueue.directive_deliver_enqueue(directive.pk)
        queued += 1
    return queued


def directive_deliver(*, directive_id: int, actor: str = SYSTEM_ACTOR) -> bool:
    """Write the directive's CSV and its ``.sig`` under its provider's S3 prefix (the
    CSV first: a provider that sees the ``.sig`` finds both). True once written; False when
    it failed, with why on the directive and in a ``directive.delivery_failed`` event (the job
    retries it).

    Recorded once, and written once unless two runs overlap: a run that finds it written
    already (a job's retry after an Operator's job wrote it) writes nothing and records
    nothing, since the provider may have taken the files and would act on them again. Two
    runs at once may both write the same bytes; one records it. A crash between the write
    and its record leaves it unwritten for the record, and the retry writes the same bytes
    again.
    """
    directive = Directive.objects.select_related("broker", "provider").get(pk=directive_id)
    if not directive.provider.s3_prefix or directive.s3_uri:
        return True
    uri = directive_s3_uri(directive)
    content = bytes(directive.content)
    try:
        s3_object_put(uri, content, endpoint_url=settings.DROPPORTAL_S3_ENDPOINT_URL)
        s3_object_put(
            f"{uri}.sig",
            f"{directive.signature}\n".encode("ascii"),
            endpoint_url=settings.DROPPORTAL_S3_ENDPOINT_URL,
        )
    except SourceError as exc:
        with transaction.atomic():
            if _written_meanwhile(directive):
                return True  # by another run: this one's failure changes nothing
            Directive.objects.filter(pk=directive.pk).update(delivery_error=str(exc)[:500])
            ledger_event_append(
                kind=LedgerKind.DIRECTIVE_DELIVERY_FAILED,
                broker_id=directive.broker.broker_id,
                subject=str(directive.pk),
                actor=actor,
                data={"s3_uri": uri, "error": str(exc)},
            )
        return False
    with transaction.atomic():
        if _written_meanwhile(directive):
            return True  # and recorded by the other run
        Directive.objects.filter(pk=directive.pk).update(
            s3_uri=uri, delivered_at=timezone.now(), delivery_error=""
        )
        ledger_event_append(
            kind=LedgerKind.DIRECTIVE_DELIVERED,
            broker_id=directive.broker.broker_id,
            subject=str(directive.pk),
            actor=actor,
            data={"s3_uri": uri, "sha256": directive.sha256},
        )
    return True


def _written_meanwhile(directive: Directive) -> bool:
    """Whether another run recorded ``directive`` written while this one wrote it; its row
    locked until the caller's transaction ends, so two runs record one outcome."""
    locked = Directive.objects.select_for_update().only("s3_uri").get(pk=directive.pk)
    return bool(locked.s3_uri)


def directive_download_record(*, directive: Directive, actor: str, via: str) -> None:
    """Staff took the directive's CSV and signature (the admin, ``drop directive --out``)."""
    ledger_event_append(
        kind=LedgerKind.DIRECTIVE_DOWNLOADED,
        broker_id=directive.broker.broker_id,
        subject=str(directive.pk),
        actor=actor,
        data={"via": via, "sha256": directive.sha256},
    )


def directive_acknowledge(*, directive: Directive, reference: str, actor: str) -> Directive:
    """Record that the provider acknowledged ``directive`` (who: ``actor``, staff or the
    provider's own key; when: now; ``reference``: theirs, a ticket or a letter). Once only:
    a directive already acknowledged is returned as it was, with no new event."""
    reference = reference.strip()
    if not reference or len(reference) > REFERENCE_MAX:
        raise ValidationError({"reference": f"a reference of 1 to {REFERENCE_MAX} characters"})
    if has_control_characters(reference):  # the provider's text, printed to staff's terminals
        raise ValidationError({"reference": "a reference must not hold control characters"})
    with transaction.atomic():
        locked = (
            Directive.objects.select_for_update(of=("self",))
            .select_related("broker", "provider")
            .get(pk=directive.pk)
        )
        if locked.acknowledged_at is not None:
            return locked
        locked.acknowledged_at = timezone.now()
        locked.acknowledged_by = actor
        locked.acknowledgement_reference = reference
        locked.save(
            update_fields=["acknowledged_at", "acknowledged_by", "acknowledgement_reference"]
        )
        ledger_event_append(
            kind=LedgerKind.DIRECTIVE_ACKNOWLEDGED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.pk),
            actor=actor,
            data={
                "provider": locked.provider.name,
                "reference": reference,
                "days": (locked.acknowledged_at - locked.created_at).days,
            },
        )
    return locked
