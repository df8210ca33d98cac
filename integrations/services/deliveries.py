"""Delivering work to the broker's systems: deletion dispatches, identifier retrieval
notifications and SaaS deletions, all through one loop.

Jobs call the entry point of their kind with the ids they were given::

    deletion_requests_deliver(request_ids=[1, 2, 3])     # tasks.deliver_deletion_requests
    resolution_requests_deliver(request_ids=[4])         # tasks.deliver_resolution_requests
    saas_deletions_deliver(deletion_ids=[5])             # tasks.deliver_saas_deletions

Each runs ``deliverables_deliver``, the whole policy of docs/contracts.md §6, on batches of
up to ``BATCH_SIZE`` ids, each batch in one transaction:

1. Lock the rows that are still due (``SELECT ... FOR UPDATE SKIP LOCKED``: state ``queued``
   and the scheduled time reached) and whose target (integration or SaaS connection) is
   enabled. A row another worker holds is skipped: that worker owns this attempt.
2. Build each call with the builder of its kind (``Outbound``: URL, body, headers) and send
   them over ``threads`` threads with ``outbound_http.deliver``; each is signed on its thread
   right before it leaves (a fresh timestamp per attempt). Those threads only do HTTP.
3. Record every ``DeliveryAttempt``, apply ``policy.classify`` (2xx delivered; 410 disables
   the target, whose rows then wait; anything else is retried on the schedule, or ends
   ``undeliverable``), defer the retry jobs and append the ledger events, then commit.

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

A kind is a ``DeliveryKind``: the model, the row's target, how to build the call, and the
job that retries it. Deletion requests and resolution requests are built per integration
kind (``DELETION_BUILDERS``, ``RESOLUTION_BUILDERS``): signed webhook POSTs, or calls to the
broker's own REST API (ISI, ``dispatch.isi``), which bring their own ``send`` (bearer token,
one new token on a 401, the answer checked) and, for the synchronous identifier retrieval,
an ``on_delivered`` that records the answer once its attempt is recorded.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from django.conf import settings
from django.db import OperationalError, connection, models, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from integrations import enqueue
from integrations.counters import DELIVERIES
from integrations.dispatch import isi, masking, signing, webhook
from integrations.dispatch.policy import classify, next_delay
from integrations.dispatch.saas import categories_or_default, saas_deletion_payload, saas_headers
from integrations.ledger_kinds import LedgerKind, ledger_kind_compose
from integrations.models import (
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
)
from integrations.outbound_http import DeliveryResult, deliver
from integrations.services.isi import isi_delivery_token, saas_identifier_categories
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append, ledger_events_append
from integrations.services.resolutions import resolution_outcome_record, resolution_settle

logger = logging.getLogger(__name__)

# Calls in flight at once per job: the work is waiting on the brokers, so threads overlap it.
DISPATCH_THREADS = 8
# Rows locked, sent and recorded together (a job holds at most 100 ids).
BATCH_SIZE = 100
REDACTED = "[redacted]"
# A batch whose broker has no free dispatch slot waits this long for one (batches to a
# healthy broker take well under a second), then is tried again BUSY_DELAY_SECONDS later.
SLOT_WAIT_SECONDS = 5.0
BUSY_DELAY_SECONDS = 30
# The first key of the advisory locks that are dispatch slots (the second: broker and slot).
SLOT_LOCK_SPACE = 0x44505344  # "DPSD"

Verdict = Literal["delivered", "retry", "gone", "undeliverable", "skipped", "deferred"]
Item = TypeVar("Item", DeletionRequest, ResolutionRequest, SaasDeletion)
Target = Integration | SaasConnection


@dataclass(frozen=True)
class Outbound:
    """One HTTP call, built for one attempt.

    ``signer`` (webhooks) adds the signature headers on the sending thread, right before the
    call leaves, so the timestamp is fresh however long the call waited for a thread.
    ``send`` (ISI) makes the call itself, on the sending thread (HTTP only), instead of one
    plain POST. ``on_delivered`` (ISI identifiers) takes a synchronous answer, inside the
    batch's transaction once the attempt is recorded as delivered. ``keep_answer=False``
    (endpoints that handle clear identifiers: SaaS deletions, ISI identifier retrieval): the
    attempt keeps only the masked shape of the answer, never its text.
    """

    url: str
    body: bytes
    headers: dict[str, str]
    signer: Callable[[bytes], dict[str, str]] | None = None
    send: Callable[[Outbound], DeliveryResult] | None = None
    on_delivered: Callable[[DeliveryResult], None] | None = None
    keep_answer: bool = True
    answer_categories: tuple[str, ...] = ()  # identifier categories asked: named when masked


class NothingToDeliver(Exception):
    """The builder found nothing to send (a SaaS deletion without identifiers of its
    categories); the row is cancelled with this message as its reason."""


class Enqueue(Protocol):
    def __call__(self, ids: Sequence[int], /, *, at: dt.datetime | None = None) -> None: ...


@dataclass(frozen=True)
class DeliveryKind(Generic[Item]):
    """Everything the loop needs to know about one kind of deliverable."""

    name: str  # prefix of its ledger events: "deletion_request", ...
    model: type[Item]
    attempt_field: str  # its foreign key on DeliveryAttempt
    related: tuple[str, ...]  # what ``target``/``build``/``subject`` read, loaded in one query
    target: Callable[[Item], Target | None]
    build: Callable[[Item], Outbound | None]  # None: no builder for this target (yet)
    subject: Callable[[Item], str]
    broker_id: Callable[[Item], str]
    enqueue: Enqueue  # queues the jobs of these ids, at a time (``integrations.enqueue``)
    acknowledged_state: str = RequestState.DISPATCHED
    after_final: Callable[[Item], None] | None = None  # inside the transaction
    ledger_data: Callable[[Item], dict[str, Any]] = field(default=lambda item: {})


@dataclass(frozen=True)
class Sent:
    """One call made: what went out (signature included) and what came back."""

    outbound: Outbound
    headers: dict[str, str]
    result: DeliveryResult
    started: dt.datetime


# -- the loop -------------------------------------------------------------------------------


def deliverables_deliver(
    *,
    kind: DeliveryKind[Item],
    ids: Sequence[int],
    threads: int | None = None,
    now: Callable[[], dt.datetime] = timezone.now,
) -> Counter[str]:
    """Deliver every id that is due; returns how many ended each way (``Verdict`` counts).

    An unexpected error while building one call (an unreadable secret) leaves that row
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


def _send(outbound: Outbound, now: Callable[[], dt.datetime]) -> Sent:
    # Runs on a sender thread: HTTP only, no database access.
    headers = dict(outbound.headers)
    if outbound.signer is not None:
        headers.update(outbound.signer(outbound.body))
    started = now()
    if outbound.send is not None:
        return Sent(outbound, headers, outbound.send(outbound), started)
    result = deliver(
        "POST",
        outbound.url,
        body=outbound.body,
        headers=headers,
        allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
    )
    if not outbound.keep_answer:
        result = dataclasses.replace(
            result,
            response_body=masking.masked(result.content, categories=outbound.answer_categories),
        )
    return Sent(outbound, headers, result, started)


def _deliver_batch(
    kind: DeliveryKind[Item],
    ids: list[int],
    pool: Executor | None,
    now: Callable[[], dt.datetime],
) -> tuple[Counter[str], Exception | None]:
    counts: Counter[str] = Counter()
    failure: Exception | None = None
    with transaction.atomic():
        items = list(
            kind.model.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related(*kind.related)
            .filter(pk__in=ids, state=RequestState.QUEUED)
            .filter(models.Q(next_attempt_at__isnull=True) | models.Q(next_attempt_at__lte=Now()))
            .order_by("pk")
        )
        # Not found: delivered, cancelled, not due yet, or being delivered right now.
        if len(items) < len(ids):
            counts["skipped"] += len(ids) - len(items)
        brokers = {kind.broker_id(item) for item in items}
        busy = {b for b in brokers if not broker_slot_take(b, wait=SLOT_WAIT_SECONDS)}
        if busy:
            later = [item.pk for item in items if kind.broker_id(item) in busy]
            kind.enqueue(later, at=now() + dt.timedelta(seconds=BUSY_DELAY_SECONDS))
            counts["deferred"] += len(later)
            items = [item for item in items if kind.broker_id(item) not in busy]
        calls: list[tuple[Item, Target, Outbound]] = []
        for item in items:
            target = kind.target(item)
            if target is None or not target.enabled:
                # Held, not dropped: enabling the target again queues it.
                counts["skipped"] += 1
                continue
            try:
                outbound = kind.build(item)
            except NothingToDeliver as reason:
                _cancel(kind, item, str(reason), now())
                counts["skipped"] += 1
                continue
            except Exception as exc:
                logger.exception("%s %s: cannot build its delivery", kind.name, item.pk)
                failure = failure or exc
                counts["skipped"] += 1
                continue
            if outbound is None:
                logger.warning("%s %s: no delivery for this target kind", kind.name, item.pk)
                counts["skipped"] += 1
                continue
            calls.append((item, target, outbound))
        if pool is None:
            sent = [_send(outbound, now) for _, _, outbound in calls]
        else:
            sent = list(pool.map(lambda call: _send(call[2], now), calls))
        finished = now()
        attempts, events, answered = [], [], []
        for (item, target, _), call in zip(calls, sent, strict=True):
            attempt, event, verdict = _apply(kind, item, target, call, finished)
            attempts.append(attempt)
            events.append(event)
            counts[verdict] += 1
            DELIVERIES.labels(kind=kind.name, result=verdict).inc()
            if verdict == "delivered" and call.outbound.on_delivered is not None:
                answered.append(call)
        if calls:
            DeliveryAttempt.objects.bulk_create(attempts)
            _save_states(kind, [item for item, _, _ in calls])
            ledger_events_append(events)
            for call in answered:
                assert call.outbound.on_delivered is not None
                call.outbound.on_delivered(call.result)
            if kind.after_final is not None:
                for item, _, _ in calls:
                    if item.state == RequestState.COMPLETED:
                        kind.after_final(item)
    return counts, failure


def broker_slot_take(broker_id: str, *, wait: float = 0) -> bool:
    """Take one of ``broker_id``'s dispatch slots until the transaction ends, waiting up to
    ``wait`` seconds for one; False when every one stays taken (by other batches in flight,
    on any worker)."""
    slots = int(settings.DROPPORTAL_DISPATCH_SLOTS_PER_BROKER)
    if slots <= 0:
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT slot FROM generate_series(0, %s - 1) AS slot"
            " WHERE pg_try_advisory_xact_lock(%s, hashtext(%s || ':' || slot)) LIMIT 1",
            [slots, SLOT_LOCK_SPACE, broker_id],
        )
        if cursor.fetchone() is not None:
            return True
        if wait <= 0:
            return False
        cursor.execute("SHOW lock_timeout")
        (previous,) = cursor.fetchone()
        try:
            with transaction.atomic():  # a savepoint: a lock timeout must not end the batch
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, true)", [f"{round(wait * 1000)}ms"]
                )
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, hashtext(%s || ':' || %s))",
                    [SLOT_LOCK_SPACE, broker_id, random.randrange(slots)],  # noqa: S311
                )
        except OperationalError:  # lock_timeout: every slot stayed taken
            return False
        finally:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
        return True


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
    item: Item,
    target: Target,
    call: Sent,
    finished: dt.datetime,
) -> tuple[DeliveryAttempt, dict[str, Any], Verdict]:
    """Policy for one attempt: the row's new state, its attempt record and ledger event."""
    result = call.result
    number = item.attempts + 1
    attempt = DeliveryAttempt(
        **{kind.attempt_field: item},
        number=number,
        started_at=call.started,
        url=call.outbound.url[:1000],
        request_headers=_redacted(call.headers),
        status=result.status,
        duration_ms=result.duration_ms,
        response_body=result.response_body,
        error=result.error or "",
    )
    verdict: Verdict = classify(result.status, result.error)
    item.attempts = number
    item.last_error = _failure_text(result) if verdict != "delivered" else ""
    data: dict[str, Any] = {
        **kind.ledger_data(item),
        "attempt": number,
        "url": call.outbound.url,
        "status": result.status,
        "duration_ms": result.duration_ms,
    }
    if verdict == "delivered":
        item.state = kind.acknowledged_state
        item.next_attempt_at = None
        item.dispatched_at = finished
        if kind.acknowledged_state == RequestState.COMPLETED:
            item.completed_at = finished
        event = "delivered"
    elif verdict == "gone":
        # Nothing more goes to this target until staff enable it again, which queues
        # this row once more; so it stays queued, attempts and all.
        item.next_attempt_at = None
        data["error"] = item.last_error
        event = "delivery_failed"
        _disable_target(kind, item, target, result, finished)
    else:
        delay = next_delay(number, status=result.status, retry_after=_header(result, "Retry-After"))
        data["error"] = item.last_error
        if delay is None:
            verdict = "undeliverable"
            item.state = RequestState.UNDELIVERABLE
            item.next_attempt_at = None
            event = "undeliverable"
        else:
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
    return attempt, ledger_entry, verdict


def _disable_target(
    kind: DeliveryKind[Item],
    item: Item,
    target: Target,
    result: DeliveryResult,
    when: dt.datetime,
) -> None:
    reason = f"410 Gone from {result.url} at {when:%Y-%m-%d %H:%M} UTC"
    # Conditional: of several deliveries hitting the 410 at once, one disables and alerts.
    disabled = (
        type(target)
        .objects.filter(pk=target.pk, enabled=True)
        .update(enabled=False, disabled_reason=reason[:200])
    )
    if not disabled:
        return
    target_name = "integration" if isinstance(target, Integration) else "saas_connection"
    logger.warning("%s %s disabled: %s", target_name, target.pk, reason)
    ledger_event_append(
        kind=(
            LedgerKind.INTEGRATION_DISABLED
            if isinstance(target, Integration)
            else LedgerKind.SAAS_CONNECTION_DISABLED
        ),
        broker_id=kind.broker_id(item),
        subject=str(target.uuid) if isinstance(target, Integration) else str(target.pk),
        data={
            "name": target.name,
            "reason": reason,
            "alert": True,  # staff must act: nothing is delivered to it until re-enabled
            "by": f"{kind.name} {kind.subject(item)}",
        },
    )
    enqueue.alerts_evaluate_enqueue()  # in the batch's transaction: alerted once it commits


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
    if kind.after_final is not None:
        kind.after_final(item)


def _failure_text(result: DeliveryResult) -> str:
    if result.error:
        return result.error if result.status is None else f"{result.status}: {result.error}"
    return f"HTTP {result.status}"


def _header(result: DeliveryResult, name: str) -> str | None:
    # response_headers is a plain dict of the names as the server spelled them.
    wanted = name.lower()
    return next((v for k, v in result.response_headers.items() if k.lower() == wanted), None)


def _redacted(headers: Mapping[str, str]) -> dict[str, str]:
    """What is kept of the request headers: everything but bearer tokens (signatures stay)."""
    return {k: (REDACTED if k.lower() == "authorization" else v) for k, v in headers.items()}


def _signed(integration: Integration, body: bytes, webhook_request_id: Any) -> Outbound:
    secret = integration.webhook_secret
    return Outbound(
        url=integration.url,
        body=body,
        headers=webhook.unsigned_headers(webhook_request_id=webhook_request_id),
        signer=lambda signed_body: signing.signed_headers(secret, signed_body),
    )


def _isi_outbound(
    integration: Integration,
    url: str,
    body: bytes,
    *,
    check: isi.AnswerCheck | None,
    keep_answer: bool = True,
    answer_categories: tuple[str, ...] = (),
    on_delivered: Callable[[DeliveryResult], None] | None = None,
) -> Outbound:
    # The token is had here, on the thread holding the batch's transaction, which may store
    # a new one; the sending thread only renews it over HTTP after a 401.
    token = isi_delivery_token(integration)

    def send(outbound: Outbound) -> DeliveryResult:
        return isi.send(
            "POST",
            outbound.url,
            body=outbound.body,
            token=token,
            check=check,
            keep_answer=keep_answer,
            categories=answer_categories,
            allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
        )

    return Outbound(
        url=url,
        body=body,
        headers=isi.request_headers(),
        send=send,
        on_delivered=on_delivered,
        keep_answer=keep_answer,
        answer_categories=answer_categories,
    )


# -- deletion requests ----------------------------------------------------------------------


def webhook_deletion_outbound(request: DeletionRequest) -> Outbound:
    integration = request.integration
    assert integration is not None
    return _signed(
        integration,
        webhook.deletion_dispatch_body(request, integration),
        request.webhook_request_id,
    )


def isi_deletion_outbound(request: DeletionRequest) -> Outbound:
    """The ISI DROP delete (§2.6) to the request's connection; acknowledged by any 2xx within
    the timeout (the body is not required to say ``{"status": "processing"}``), completed
    later by the broker's callback."""
    integration, connection_ = request.integration, request.isi_connection
    assert integration is not None and connection_ is not None
    return _isi_outbound(
        integration,
        isi.endpoint(integration.base_url, isi.DELETE_PATH, connection_.uuid),
        isi.delete_body(request),
        check=None,
    )


# Per integration kind.
DELETION_BUILDERS: dict[str, Callable[[DeletionRequest], Outbound]] = {
    "webhook": webhook_deletion_outbound,
    "isi": isi_deletion_outbound,
}


def _deletion_build(request: DeletionRequest) -> Outbound | None:
    integration = request.integration
    builder = DELETION_BUILDERS.get(integration.kind) if integration else None
    return builder(request) if builder else None


DELETION_REQUESTS: DeliveryKind[DeletionRequest] = DeliveryKind(
    name="deletion_request",
    model=DeletionRequest,
    attempt_field="deletion_request",
    related=("integration", "isi_connection"),
    target=lambda request: request.integration,
    build=_deletion_build,
    subject=lambda request: str(request.request_uuid),
    broker_id=lambda request: request.broker_id_code,
    enqueue=enqueue.deletion_requests_enqueue,
    ledger_data=lambda request: {"webhook_request_id": str(request.webhook_request_id)},
)


def deletion_requests_deliver(
    *, request_ids: Sequence[int], threads: int | None = None
) -> Counter[str]:
    """Deliver the deletion requests among ``request_ids`` that are due (body §2.1)."""
    return deliverables_deliver(kind=DELETION_REQUESTS, ids=request_ids, threads=threads)


# -- resolution requests --------------------------------------------------------------------


def webhook_resolution_outbound(request: ResolutionRequest) -> Outbound:
    integration = request.integration
    body = webhook.resolution_notification_body(request, integration, request.broker)
    return _signed(integration, body, request.webhook_request_id)


def isi_resolution_outbound(request: ResolutionRequest) -> Outbound:
    """The ISI identifier retrieval (§2.6) for the categories the broker's SaaS connections
    delete by; its synchronous answer is recorded as the webhook resolution callback's is,
    which starts the SaaS deletions."""
    integration, connection_ = request.integration, request.isi_connection
    assert connection_ is not None
    categories = saas_identifier_categories(broker_id=request.broker_id)

    def record_answer(result: DeliveryResult) -> None:
        resolution_outcome_record(
            resolution_request=request,
            drop_outcome="",
            exemption_basis="",
            identifiers=isi.identifiers_answer(result),  # checked already by the send
            actor=SYSTEM_ACTOR,
        )

    return _isi_outbound(
        integration,
        isi.endpoint(integration.base_url, isi.IDENTIFIERS_PATH, connection_.uuid),
        isi.identifiers_body(request, categories),
        check=isi.identifiers_answer_error,
        keep_answer=False,  # clear identifiers: the attempt keeps only their shape
        answer_categories=tuple(categories),
        on_delivered=record_answer,
    )


RESOLUTION_BUILDERS: dict[str, Callable[[ResolutionRequest], Outbound]] = {
    "webhook": webhook_resolution_outbound,
    "isi": isi_resolution_outbound,
}


def _resolution_build(request: ResolutionRequest) -> Outbound | None:
    builder = RESOLUTION_BUILDERS.get(request.integration.kind)
    return builder(request) if builder else None


RESOLUTION_REQUESTS: DeliveryKind[ResolutionRequest] = DeliveryKind(
    name="resolution_request",
    model=ResolutionRequest,
    attempt_field="resolution_request",
    related=("integration", "broker", "isi_connection"),
    target=lambda request: request.integration,
    build=_resolution_build,
    subject=lambda request: str(request.request_uuid),
    broker_id=lambda request: request.broker.broker_id,
    enqueue=enqueue.resolution_requests_enqueue,
    ledger_data=lambda request: {"webhook_request_id": str(request.webhook_request_id)},
)


def resolution_requests_deliver(
    *, request_ids: Sequence[int], threads: int | None = None
) -> Counter[str]:
    """Deliver the identifier retrieval notifications (body §2.3) that are due."""
    return deliverables_deliver(kind=RESOLUTION_REQUESTS, ids=request_ids, threads=threads)


# -- SaaS deletions -------------------------------------------------------------------------


def saas_deletion_outbound(deletion: SaasDeletion) -> Outbound:
    resolution = deletion.resolution
    connection_ = deletion.saas_connection
    identifiers = json.loads(resolution.identifiers) if resolution.identifiers else {}
    payload = saas_deletion_payload(
        request_uuid=resolution.request_uuid,
        broker_id=resolution.broker.broker_id,
        identifiers=identifiers,
        categories=connection_.identifier_categories,
    )
    if payload is None:
        raise NothingToDeliver(
            "nothing to delete: the broker resolved no identifier of the categories "
            + ", ".join(connection_.identifier_categories or ["email"])
        )
    return Outbound(
        url=connection_.url,
        body=webhook.encode(payload),
        headers=saas_headers(connection_.token),
        keep_answer=False,  # it sends clear identifiers: an answer may echo them
        answer_categories=tuple(categories_or_default(connection_.identifier_categories)),
    )


def _saas_final(deletion: SaasDeletion) -> None:
    resolution_settle(resolution_id=deletion.resolution_id)


SAAS_DELETIONS: DeliveryKind[SaasDeletion] = DeliveryKind(
    name="saas_deletion",
    model=SaasDeletion,
    attempt_field="saas_deletion",
    related=("resolution", "resolution__broker", "saas_connection"),
    target=lambda deletion: deletion.saas_connection,
    build=saas_deletion_outbound,
    subject=lambda deletion: str(deletion.resolution.request_uuid),
    broker_id=lambda deletion: deletion.resolution.broker.broker_id,
    enqueue=enqueue.saas_deletions_enqueue,
    # The SaaS answers synchronously: its 2xx is the deletion done, there is no callback.
    acknowledged_state=RequestState.COMPLETED,
    after_final=_saas_final,
    ledger_data=lambda deletion: {
        "saas_deletion": deletion.pk,
        "saas_connection": deletion.saas_connection.name,
    },
)


def saas_deletions_deliver(
    *, deletion_ids: Sequence[int], threads: int | None = None
) -> Counter[str]:
    """Send the SaaS deletions among ``deletion_ids`` that are due."""
    return deliverables_deliver(kind=SAAS_DELETIONS, ids=deletion_ids, threads=threads)
