"""The delivery loop: how every deliverable (deletion dispatches, identifier retrieval
notifications, SaaS deletions) goes to the broker's systems.

``services.dispatch.deliveries`` holds the kinds; each entry point there runs::

    deliverables_deliver(kind=DELETION_REQUESTS, ids=[1, 2, 3])

``deliverables_deliver`` is the whole policy of docs/contracts.md §6, on batches of
up to ``BATCH_SIZE`` ids, each batch in one transaction:

1. Lock the rows that are still due (``SELECT ... FOR UPDATE SKIP LOCKED``: state ``queued``
   and the scheduled time reached) and whose target (integration or SaaS connection) is
   enabled. A row another worker holds is skipped, and queued again for 30 s later: that
   worker owns this attempt, but its transaction may yet roll back.
2. Build each row's ``Message`` with its kind's ``outbound`` and hand the messages to the
   transport of their target's kind (``dispatch.transports.TRANSPORTS``: webhook, ISI,
   SaaS), which sends them over ``threads`` threads and returns one ``Verdict`` each. Those
   threads only send (a webhook is signed there, right before it leaves).
3. Record every ``DeliveryAttempt`` as its verdict says, and apply it: delivered; gone
   disables the target, whose rows then wait; retry is tried again on the schedule
   (``policy.next_delay``), or ends ``undeliverable`` after the last attempt, as a failed
   one does at once. Defer the retry jobs and append the ledger events, then commit.

A broker has at most ``DROPPORTAL_DISPATCH_SLOTS_PER_BROKER`` batches in flight at once,
across every worker (PostgreSQL advisory locks held by the batch's transaction): the rows of
a broker whose slots are all taken are left as they are and their job is deferred by
``BUSY_DELAY_SECONDS``, which frees the worker slot at once. So one slow broker (every call
taking its whole timeout) holds at most that many of the dispatch queue's worker slots, and
the others' deliveries go on.

The rows stay locked while their calls are in flight, so two workers never deliver the same
thing at once, and a worker killed mid-batch leaves no trace but unacknowledged rows that
its re-run job (``tasks.retry_stalled_jobs``) delivers again: at least once, never again
once acknowledged. A retry job is scheduled for exactly ``next_attempt_at``, and only a job
at or after that time finds the row due, so a duplicate job cannot shorten the schedule.
A batch costs six queries or so however many calls it makes, which is what lets one worker
keep up with matching (see ``bench/bench_dispatch.py``).

A kind is anything with the ``DeliveryKind`` protocol: which rows (model, the
``DeliveryAttempt`` field, what to load with them), and per row its target, its ledger
subject and broker, its ``Message``, and how to queue its retry. The loop never sees how a
message travels: that is the ``dispatch.transport.Transport`` of the target's kind.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol, TypeVar

from django.db import models, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from integrations.counters import DELIVERIES
from integrations.dispatch import masking
from integrations.dispatch.policy import next_delay
from integrations.dispatch.transport import Message, Transport, Verdict
from integrations.dispatch.transports import TRANSPORTS
from integrations.ledger_kinds import ledger_kind_compose
from integrations.models import (
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
)
from integrations.services.cycle.targets import target_gone
from integrations.services.dispatch.dispatch_slots import broker_slot_take
from integrations.services.ledger import ledger_event_append, ledger_events_append
from integrations.url_extras import without_url_extras

logger = logging.getLogger(__name__)

# Calls in flight at once per job: the work is waiting on the brokers, so threads overlap it.
DISPATCH_THREADS = 8
# Rows locked, sent and recorded together (a job holds at most 100 ids).
BATCH_SIZE = 100
# A batch whose broker has no free dispatch slot waits this long for one (batches to a
# healthy broker take well under a second), then is tried again BUSY_DELAY_SECONDS later.
SLOT_WAIT_SECONDS = 5.0
BUSY_DELAY_SECONDS = 30

# How each row of a batch ended (what ``deliverables_deliver`` counts).
Ending = Literal["delivered", "retry", "gone", "undeliverable", "skipped", "deferred"]
Item = TypeVar("Item", DeletionRequest, ResolutionRequest, SaasDeletion)
Target = Integration | SaasConnection


class NothingToDeliver(Exception):
    """The builder found nothing to send (a SaaS deletion without identifiers of its
    categories); the row is cancelled with this message as its reason."""


class DeliveryKind(Protocol[Item]):
    """What the loop needs of one kind of deliverable (``services.dispatch.deliveries`` has
    the three).

    ``name`` prefixes its ledger events (``deletion_request.delivered``); ``model`` its rows,
    loaded with ``related`` (what the methods read) and attempts recorded under
    ``attempt_field``; a delivered one is left ``acknowledged_state``.
    """

    name: str
    model: type[Item]
    attempt_field: str
    related: tuple[str, ...]
    acknowledged_state: str

    def target(self, item: Item) -> Target | None:
        """Where it goes (None: nowhere yet)."""

    def subject(self, item: Item) -> str:
        """Its ledger events' subject."""

    def broker_id(self, item: Item) -> str:
        """Its broker's 4-digit ID."""

    def ledger_data(self, item: Item) -> dict[str, Any]:
        """What every one of its ledger events says about it."""

    def outbound(self, item: Item) -> Message | None:
        """The message for its target's transport (None: none for this target kind); may
        raise ``NothingToDeliver``."""

    def enqueue(self, ids: Sequence[int], /, *, at: dt.datetime | None = None) -> None:
        """Queue the delivery jobs of ``ids`` (``integrations.enqueue``)."""

    def after_final(self, item: Item) -> None:
        """Inside the batch's transaction, once it is completed or cancelled."""

    def settles(self, item: Item) -> tuple[int, int]:
        """Whose status its answer or its end settles, as (work item id, request id): the
        request whose row that locks with its work item's (a SaaS deletion's resolution),
        else itself. The batch settles its rows in this order (``_settle_in_order``)."""


def target_kind(target: Target) -> str:
    """The kind of target, which names its transport: an integration's ``kind``, or
    ``"saas"`` for a SaaS connection."""
    return target.kind if isinstance(target, Integration) else "saas"


# -- the loop -------------------------------------------------------------------------------


def deliverables_deliver(
    *,
    kind: DeliveryKind[Item],
    ids: Sequence[int],
    threads: int | None = None,
    now: Callable[[], dt.datetime] = timezone.now,
) -> Counter[str]:
    """Deliver every id that is due; returns how many ended each way (``Ending`` counts).

    An unexpected error while building one message (an unreadable secret) leaves that row
    queued and the others go on; it is raised once the batch is recorded, so the job is
    retried, which is safe: what was acknowledged is no longer due. A database error fails
    the batch as a whole, and the job's retry runs it again.
    """
    unique = list(dict.fromkeys(ids))
    counts: Counter[str] = Counter()
    failure: Exception | None = None
    with _senders(DISPATCH_THREADS if threads is None else threads) as pool:
        for start in range(0, len(unique), BATCH_SIZE):
            batch_counts, batch_failure = _deliver_batch(
                kind, unique[start : start + BATCH_SIZE], pool, now
            )
            counts.update(batch_counts)
            failure = failure or batch_failure
    if failure is not None:
        raise failure
    return counts


@contextmanager
def _senders(threads: int) -> Iterator[Executor | None]:
    if threads <= 1:
        yield None
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="dispatch") as pool:
        yield pool


@dataclass(frozen=True)
class Call:
    """One row's attempt in a batch: the row, its target, that target's transport, the
    message handed to it."""

    item: Any
    target: Target
    transport: Transport
    message: Message


def _send(calls: list[Call], pool: Executor | None) -> list[Verdict]:
    """Each transport sends its messages as one batch; the verdicts come back in the order
    of ``calls``. Runs the transports only: no database access on their threads."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for index, call in enumerate(calls):
        by_kind[call.transport.kind].append(index)
    verdicts: list[Verdict | None] = [None] * len(calls)
    for indexes in by_kind.values():
        transport = calls[indexes[0]].transport
        sent = transport.send([calls[i].message for i in indexes], pool)
        for index, verdict in zip(indexes, sent, strict=True):
            verdicts[index] = verdict
    return [verdict for verdict in verdicts if verdict is not None]


def _deliver_batch(
    kind: DeliveryKind[Item],
    ids: list[int],
    pool: Executor | None,
    now: Callable[[], dt.datetime],
) -> tuple[Counter[str], Exception | None]:
    counts: Counter[str] = Counter()
    failure: Exception | None = None
    due = models.Q(next_attempt_at__isnull=True) | models.Q(next_attempt_at__lte=Now())
    with transaction.atomic():
        items = list(
            kind.model.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related(*kind.related)
            .filter(pk__in=ids, state=RequestState.QUEUED)
            .filter(due)
            .order_by("pk")
        )
        # Not found: delivered, cancelled, not due yet, or locked by another transaction.
        if len(items) < len(ids):
            # Locked, and still queued and due as far as this transaction sees: being
            # delivered by another job, whose transaction may yet roll back (its worker
            # killed mid-batch after a stalled-job retry queued this very job). They keep a
            # job of their own, or nothing would ever send them; delivered meanwhile, that
            # job finds them done.
            found = {item.pk for item in items}
            held = list(
                kind.model.objects.filter(
                    pk__in=[pk for pk in ids if pk not in found], state=RequestState.QUEUED
                )
                .filter(due)
                .values_list("pk", flat=True)
            )
            if held:
                kind.enqueue(held, at=now() + dt.timedelta(seconds=BUSY_DELAY_SECONDS))
                counts["deferred"] += len(held)
            if skipped := len(ids) - len(items) - len(held):
                counts["skipped"] += skipped
        brokers = {kind.broker_id(item) for item in items}
        busy = {b for b in brokers if not broker_slot_take(b, wait=SLOT_WAIT_SECONDS)}
        if busy:
            later = [item.pk for item in items if kind.broker_id(item) in busy]
            kind.enqueue(later, at=now() + dt.timedelta(seconds=BUSY_DELAY_SECONDS))
            counts["deferred"] += len(later)
            items = [item for item in items if kind.broker_id(item) not in busy]
        calls: list[Call] = []
        # What each row's end or answer settles, run once every row is written.
        settlements: list[tuple[Item, Callable[[], None]]] = []
        for item in items:
            target = kind.target(item)
            if target is None or not target.enabled:
                # Held, not dropped: enabling the target again queues it.
                counts["skipped"] += 1
                continue
            transport = TRANSPORTS.get(target_kind(target))
            try:
                message = kind.outbound(item) if transport is not None else None
            except NothingToDeliver as reason:
                _cancel(kind, item, str(reason), now())
                settlements.append((item, partial(kind.after_final, item)))
                counts["skipped"] += 1
                continue
            except Exception as exc:
                logger.exception("%s %s: cannot build its delivery", kind.name, item.pk)
                failure = failure or exc
                counts["skipped"] += 1
                continue
            if transport is None or message is None:
                logger.warning("%s %s: no delivery for this target kind", kind.name, item.pk)
                counts["skipped"] += 1
                continue
            calls.append(Call(item, target, transport, message))
        verdicts = _send(calls, pool)
        finished = now()
        attempts, events = [], []
        for call, verdict in zip(calls, verdicts, strict=True):
            attempt, event, ending = _apply(kind, call, verdict, finished)
            attempts.append(attempt)
            events.append(event)
            counts[ending] += 1
            DELIVERIES.labels(kind=kind.name, result=ending).inc()
            if ending == "delivered" and call.message.on_delivered is not None:
                settlements.append((call.item, partial(call.message.on_delivered, verdict)))
            if call.item.state == RequestState.COMPLETED:
                settlements.append((call.item, partial(kind.after_final, call.item)))
        if calls:
            DeliveryAttempt.objects.bulk_create(attempts)
            _save_states(kind, [call.item for call in calls])
            ledger_events_append(events)
        _settle_in_order(kind, settlements)
    return counts, failure


def _settle_in_order(
    kind: DeliveryKind[Item], settlements: list[tuple[Item, Callable[[], None]]]
) -> None:
    """Run the batch's settlements in their work items' order (``DeliveryKind.settles``).

    Each locks a work item (a SaaS deletion's, its resolution just before), and so does
    every other transaction that settles several, in that same order (``matching_lock``):
    taken in the order of the batch's rows, two settlements could each hold an item the
    other waits for. The sort is stable: a row's answer is recorded before its end settles.
    """
    for _, settle in sorted(settlements, key=lambda pair: kind.settles(pair[0])):
        settle()


def _save_states(kind: DeliveryKind[Item], items: list[Item]) -> None:
    """One UPDATE per distinct outcome, not per row: a batch of acknowledgements is one.

    (Django's ``bulk_update`` builds a CASE per field and row, which costs more CPU than
    the deliveries themselves.) Every row made one attempt, hence ``attempts + 1``.
    """
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for item in items:
        key = (item.state, item.last_error, item.next_attempt_at, item.dispatched_at,
               item.completed_at)  # fmt: skip
        groups[key].append(item.pk)
    for (state, last_error, next_attempt_at, dispatched_at, completed_at), pks in groups.items():
        kind.model.objects.filter(pk__in=pks).update(
            state=state,
            attempts=F("attempts") + 1,
            last_error=last_error,
            next_attempt_at=next_attempt_at,
            dispatched_at=dispatched_at,
            completed_at=completed_at,
        )


def _apply(
    kind: DeliveryKind[Item],
    call: Call,
    verdict: Verdict,
    finished: dt.datetime,
) -> tuple[DeliveryAttempt, dict[str, Any], Ending]:
    """Policy for one attempt: the row's new state, its attempt record and ledger event."""
    item: Item = call.item
    recorded = verdict.attempt
    number = item.attempts + 1
    attempt = DeliveryAttempt(
        **{kind.attempt_field: item},
        number=number,
        started_at=recorded.started,
        # A target's query may carry a token (``?key=``): the request goes to the whole URL;
        # what is kept of it (this record, the row's last error, a disabled target's reason)
        # holds its scheme, host and path only.
        url=without_url_extras(recorded.address, value=True)[:1000],
        request_headers=recorded.request_headers,
        status=recorded.status,
        duration_ms=recorded.duration_ms,
        response_body=recorded.response,
        error=_failure_kept(recorded.error, call.message),
    )
    ending: Ending
    item.attempts = number
    item.last_error = (
        _failure_kept(verdict.failure, call.message) if verdict.outcome != "delivered" else ""
    )
    data: dict[str, Any] = {
        **kind.ledger_data(item),
        "attempt": number,
        "url": recorded.address,
        "status": recorded.status,
        "duration_ms": recorded.duration_ms,
    }
    if verdict.outcome == "delivered":
        ending = "delivered"
        item.state = kind.acknowledged_state
        item.next_attempt_at = None
        item.dispatched_at = finished
        if kind.acknowledged_state == RequestState.COMPLETED:
            item.completed_at = finished
        event = "delivered"
    elif verdict.outcome == "gone":
        # Nothing more goes to this target until staff enable it again, which queues
        # this row once more; so it stays queued, attempts and all.
        ending = "gone"
        item.next_attempt_at = None
        data["error"] = item.last_error
        event = "delivery_failed"
        target_gone(
            target=call.target,
            broker_id=kind.broker_id(item),
            why=verdict.disable_reason,
            when=finished,
            by=f"{kind.name} {kind.subject(item)}",
        )
    else:
        data["error"] = item.last_error
        delay = None
        if verdict.outcome == "retry":
            delay = next_delay(number, asked=verdict.retry_after)
        if delay is None:
            ending = "undeliverable"
            item.state = RequestState.UNDELIVERABLE
            item.next_attempt_at = None
            event = "undeliverable"
        else:
            ending = "retry"
            item.next_attempt_at = finished + dt.timedelta(seconds=delay)
            data["next_attempt_at"] = item.next_attempt_at.isoformat()
            event = "delivery_failed"
            kind.enqueue([item.pk], at=item.next_attempt_at)
    ledger_entry = {
        "kind": ledger_kind_compose(kind.name, event),
        "broker_id": kind.broker_id(item),
        "subject": kind.subject(item),
        "data": data,
    }
    return attempt, ledger_entry, ending


def _failure_kept(text: str, message: Message) -> str:
    """A failure's text as its attempt, its row and the ledger keep it: its URLs cut (as
    ``without_url_extras`` cuts them) and what looks like an identifier masked, the row's own
    UUIDs kept. The broker's own words may be in it (an ISI answer refused by its check, an
    OAuth error's description), as they are in an answer. Short: it is kept whole."""
    return masking.free_text_masked(text, limit=sys.maxsize, own_uuids=message.own_uuids)


def _cancel(kind: DeliveryKind[Item], item: Item, reason: str, when: dt.datetime) -> None:
    item.state = RequestState.CANCELLED
    item.last_error = reason
    item.next_attempt_at = None
    item.completed_at = when
    item.save(update_fields=["state", "last_error", "next_attempt_at", "completed_at"])
    ledger_event_append(
        kind=ledger_kind_compose(kind.name, "cancelled"),
        broker_id=kind.broker_id(item),
        subject=kind.subject(item),
        data={**kind.ledger_data(item), "reason": reason},
    )
