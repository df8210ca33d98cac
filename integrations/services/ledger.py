"""Writing, sealing and verifying the ledger.

Every state change calls ``ledger_event_append`` inside its own transaction, so the event
commits (or rolls back) with the change it records::

    with transaction.atomic():
        broker.save()
        ledger_event_append(kind=LedgerKind.BROKER_CREATED, broker_id="4821", actor="cli",
                            subject="4821", data={"name": "Acme"})

Every kind is a member of ``LedgerKind`` (integrations/ledger_kinds.py); any other is refused.

A periodic job (and ``ledger verify``) runs ``ledger_seal``, which chains the committed
events; ``ledger_verify`` recomputes every hash and names the first event that breaks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from integrations.ledger_hash import GENESIS_HASH, canonical_json, chain_hash, event_hash
from integrations.ledger_kinds import LedgerKind, ledger_kind_check
from integrations.models import LedgerChainLink, LedgerEvent
from integrations.models.fields import ACTOR_MAX_LENGTH
from integrations.url_extras import data_without_url_extras

SYSTEM_ACTOR = "system"

# How the interfaces name a person in the ledger: "staff:<username>" (the admin) and
# "cli:<OS user>" (the commands). The same name under either is taken for the same person.
_PERSON_PREFIXES = ("staff", "cli")


def actor_person(actor: str) -> str | None:
    """The person behind a ledger actor, or None for the service itself (``system``, a job)."""
    if actor == SYSTEM_ACTOR or actor.startswith(f"{SYSTEM_ACTOR}:"):
        return None
    prefix, colon, name = actor.partition(":")
    if colon and prefix in _PERSON_PREFIXES:
        return name
    return actor


_SEAL_LOCK_KEY = 0x64726F70  # "drop": serializes sealers only, never writers


# The database hashes each event as it stores it (integrations/sql/ledger_append.sql, the
# one writer of hashes, which the SQL write paths use too); ``event_hash`` is the
# verifier's own computation of the same thing (integrations/ledger_hash.py).
_INSERT_EVENTS = """
INSERT INTO integrations_ledgerevent (created_at, broker_id, kind, subject, actor, data, event_hash)
SELECT e.created_at, e.broker_id, e.kind, e.subject, e.actor, e.data::jsonb,
       dropportal_ledger_event_hash(e.created_at, e.broker_id, e.kind, e.subject, e.actor, e.data)
FROM (VALUES {rows}) AS e (created_at, broker_id, kind, subject, actor, data)
RETURNING id, txid, event_hash
"""
_ROW = "(%s::timestamptz, %s::text, %s::text, %s::text, %s::text, %s::text)"


def canonical_data(data: dict[str, Any] | None) -> str:
    """An event's data as the canonical JSON its hash covers (and the database stores).

    Every URL in it keeps its scheme, host and path only: its query and fragment (where
    tokens and identifiers travel) and any user:password part are cut, on every path that
    writes an event (the SQL ones take their data from here too)."""
    return canonical_json(_as_jsonb_gives_back(data_without_url_extras(data or {})))


def _as_jsonb_gives_back(value: Any) -> Any:
    """``value`` with its floats as PostgreSQL's jsonb gives them back, which is what
    ``ledger_verify`` and the pack verifier hash: a float of 1e16 or more (written
    ``1e+16``) comes back as its digits, an integer, and -0.0 as 0.0; a key that is not a
    string (``{10: 1, 9: 2}``) as JSON's text of it, sorted as text (``"10"`` before
    ``"9"``; Python sorts the numbers). Hashed as written, such an event would break the
    chain's verification for good."""
    if isinstance(value, float):
        if value == 0:
            return 0.0
        if math.isfinite(value) and abs(value) >= _FLOAT_DIGITS_FROM:
            return int(Decimal(repr(value)))
        return value
    if isinstance(value, dict):
        return {
            key if isinstance(key, str) else json.dumps(key): _as_jsonb_gives_back(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_as_jsonb_gives_back(item) for item in value]
    return value


# Where Python's repr of a float turns to exponent notation (PostgreSQL's numeric never does).
_FLOAT_DIGITS_FROM = 1e16


def ledger_event_append(
    *,
    kind: LedgerKind,
    actor: str = SYSTEM_ACTOR,
    broker_id: str = "",
    subject: str = "",
    data: dict[str, Any] | None = None,
) -> LedgerEvent:
    """Append one event. Call it inside the transaction of the change it records."""
    (event,) = ledger_events_append(
        [{"kind": kind, "actor": actor, "broker_id": broker_id, "subject": subject, "data": data}]
    )
    return event


def ledger_events_append(entries: Iterable[dict[str, Any]]) -> list[LedgerEvent]:
    """Append several events in one INSERT; each entry holds ``ledger_event_append``'s
    arguments. For paths that record several changes in one transaction (a delivery batch).
    A kind that is not registered (``LedgerKind``) is a ValueError, and nothing is written."""
    events: list[LedgerEvent] = []
    params: list[Any] = []
    for entry in entries:
        event, data_json = _new_event(**entry)
        events.append(event)
        params += [
            event.created_at,
            event.broker_id,
            event.kind,
            event.subject,
            event.actor,
            data_json,
        ]
    if not events:
        return []
    with connection.cursor() as cursor:
        # rows: placeholders only
        cursor.execute(_INSERT_EVENTS.format(rows=", ".join([_ROW] * len(events))), params)
        # Rows come back in the order of VALUES (as bulk_create relies on too).
        for event, (event_id, txid, hashed) in zip(events, cursor.fetchall(), strict=True):
            event.id, event.txid, event.event_hash = event_id, txid, hashed
            event._state.adding = False
    return events


def _new_event(
    *,
    kind: str,  # checked here: entries of ledger_events_append are not typed
    actor: str = SYSTEM_ACTOR,
    broker_id: str = "",
    subject: str = "",
    data: dict[str, Any] | None = None,
) -> tuple[LedgerEvent, str]:
    """The event to insert (its hash comes back from the INSERT), and its data as the
    canonical JSON the INSERT stores and hashes."""
    data_json = canonical_data(data)
    event = LedgerEvent(
        created_at=timezone.now(),
        broker_id=broker_id,
        kind=ledger_kind_check(kind).value,  # stored as the plain string it stands for
        subject=subject[:200],
        actor=actor[:ACTOR_MAX_LENGTH],
        data=json.loads(data_json),  # what the database will give back
    )
    return event, data_json


def _recomputed_hash(event: LedgerEvent) -> str:
    return event_hash(
        created_at=event.created_at,
        broker_id=event.broker_id,
        kind=event.kind,
        subject=event.subject,
        actor=event.actor,
        data=event.data,
    )


# Events chained per transaction of the sealer (a parameter of ledger_seal, for the tests).
SEAL_BATCH_SIZE = 5000


def ledger_seal(*, batch_size: int = SEAL_BATCH_SIZE) -> int:
    """Chain every committed, unsealed event; return how many were sealed.

    Ordering in the chain is the order of sealing, so an event whose transaction commits
    late is sealed in a later batch rather than lost. The candidates are the events
    written by transactions at or after the previous seal's horizon: every older
    transaction had finished then, so its events were already visible and sealed.

    Within one call, the batches after a full one read on past the last event it sealed
    (``id > after``), not from the horizon again over every event sealed since (quadratic
    in a backlog). An event they pass over was not yet committed when the batch that
    passed its id looked, so not when the first batch did either: its transaction is at
    or after the first batch's horizon, which is the horizon the call records. The next
    call starts from there and seals it.
    """
    sealed = 0
    after = 0
    call_horizon: int | None = None
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_SEAL_LOCK_KEY])
                cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                horizon = int(cursor.fetchone()[0])
            # Every event visible to this first snapshot is sealed by the call's end: each
            # batch takes the lowest unsealed ids above the last one, up to a partial batch.
            if call_horizon is None:
                call_horizon = horizon
            last = LedgerChainLink.objects.order_by("-position").first()
            previous_hash = last.chain_hash if last else GENESIS_HASH
            since = last.horizon_txid if last else 0
            # NOT EXISTS, bounded on both sides: PostgreSQL then merges the two id indexes
            # from ``after`` on. A LEFT JOIN ... IS NULL (``chain_link__isnull``) hashes the
            # whole chain for every batch, and an anti-join bounded on the events' side
            # only walks the chain's index from its start.
            sealed_links = LedgerChainLink.objects.filter(
                event_id=OuterRef("id"), event_id__gt=after
            )
            events = list(
                LedgerEvent.objects.filter(~Exists(sealed_links), txid__gte=since, id__gt=after)
                .order_by("id")
                .only("id", "event_hash")[:batch_size]
            )
            if not events:
                return sealed
            now = timezone.now()
            links = []
            for event in events:
                previous_hash = chain_hash(previous_hash, event.id, event.event_hash)
                links.append(
                    LedgerChainLink(
                        event_id=event.id,
                        chain_hash=previous_hash,
                        sealed_at=now,
                        # A full batch keeps the old horizon so the rest stays a candidate.
                        horizon_txid=call_horizon if len(events) < batch_size else since,
                    )
                )
            LedgerChainLink.objects.bulk_create(links)
            sealed += len(links)
            if len(events) < batch_size:
                return sealed
            after = events[-1].id


@dataclass(frozen=True)
class LedgerBreak:
    event_id: int
    reason: str

    def __str__(self) -> str:
        return f"event {self.event_id}: {self.reason}"


@dataclass(frozen=True)
class LedgerVerification:
    events_checked: int
    chain_length: int
    first_break: LedgerBreak | None

    @property
    def ok(self) -> bool:
        return self.first_break is None


def ledger_verify(*, chunk_size: int = 5000) -> LedgerVerification:
    """Recompute every event hash and the whole chain; report the first break."""
    previous_hash = GENESIS_HASH
    chain_length = 0
    checked = 0
    last_horizon = 0
    for link, event in _links_with_events(chunk_size):
        chain_length += 1
        last_horizon = max(last_horizon, link.horizon_txid)
        if event is None:
            return LedgerVerification(
                checked, chain_length, LedgerBreak(link.event_id, "is in the chain but missing")
            )
        checked += 1
        if _recomputed_hash(event) != event.event_hash:
            return LedgerVerification(
                checked, chain_length, LedgerBreak(event.id, "content does not match its hash")
            )
        previous_hash = chain_hash(previous_hash, event.id, event.event_hash)
        if previous_hash != link.chain_hash:
            return LedgerVerification(
                checked, chain_length, LedgerBreak(event.id, "chain hash does not match")
            )
    # Events outside the chain: new ones only (an old one was slipped in past the sealer).
    unsealed = LedgerEvent.objects.filter(chain_link__isnull=True).order_by("id")
    for event in unsealed.iterator(chunk_size=chunk_size):
        checked += 1
        if event.txid < last_horizon:
            return LedgerVerification(
                checked, chain_length, LedgerBreak(event.id, "was written outside the chain")
            )
        if _recomputed_hash(event) != event.event_hash:
            return LedgerVerification(
                checked, chain_length, LedgerBreak(event.id, "content does not match its hash")
            )
    return LedgerVerification(checked, chain_length, None)


def _links_with_events(
    chunk_size: int,
) -> Iterator[tuple[LedgerChainLink, LedgerEvent | None]]:
    after = 0
    while True:
        links = list(LedgerChainLink.objects.filter(position__gt=after)[:chunk_size])
        if not links:
            return
        events = LedgerEvent.objects.in_bulk([link.event_id for link in links])
        for link in links:
            yield link, events.get(link.event_id)
        after = links[-1].position


def ledger_verify_record(*, actor: str = SYSTEM_ACTOR) -> LedgerVerification:
    """Seal, then ``ledger_verify``, and keep the result as a ``ledger.verified`` event (the
    nightly job's work; a break raises the ``ledger_verify_failed`` alert)."""
    ledger_seal()
    result = ledger_verify()
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.LEDGER_VERIFIED,
            actor=actor,
            subject="ledger",
            data={
                "ok": result.ok,
                "events_checked": result.events_checked,
                "chain_length": result.chain_length,
                "first_break": str(result.first_break) if result.first_break else None,
            },
        )
    return result
