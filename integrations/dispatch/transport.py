"""How a delivery reaches one kind of target: the ``Transport`` protocol.

The delivery loop (``services.dispatch.delivery_loop``) locks the rows that are due, asks its
deliverable kind (``services.dispatch.deliveries``) for one ``Message`` per row, hands each target
kind's messages to that kind's transport (``dispatch.transports.TRANSPORTS``) and gets back
one ``Verdict`` per message, in order::

    verdicts = TRANSPORTS["webhook"].send([message, ...], pool)
    verdicts[0].outcome        # "delivered" | "retry" | "gone" | "failed"
    verdicts[0].attempt        # what its DeliveryAttempt records

A kind of integration's transport also builds its requests' messages (``RequestMessages``)::

    message = request_messages("webhook").deletion_message(deletion_request)  # dispatch.transports

The loop knows nothing of HTTP: what a status code means is each transport's business (the
three of today are HTTP, so they share ``http_verdict``, and webhook and SaaS the plain
``http_post``). A transport runs on the sending threads: no database access, no ledger.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from django.conf import settings
from django.utils import timezone

from integrations.dispatch import masking
from integrations.dispatch.policy import RETRY_AFTER_STATUSES, classify
from integrations.models import DeletionRequest, ResolutionRequest
from integrations.outbound_http import (
    RESPONSE_BODY_LIMIT,
    DeliveryResult,
    deliver,
    retry_after_seconds,
)
from integrations.redaction import REDACTED, secrets_pattern
from integrations.storable_text import storable
from integrations.url_extras import url_extras_sent

Outcome = Literal["delivered", "retry", "gone", "failed"]


@dataclass(frozen=True)
class Message:
    """One delivery to one target, built for one attempt.

    ``address`` says where it goes (a URL today), recorded on its attempt and ledger event;
    ``body`` is what is handed over and ``headers`` what goes along with it. ``credential``
    is the transport's to use as it sends (a webhook's signing secret, an ISI
    ``BearerToken``), ``check`` (ISI) refuses a delivered answer that is not the expected
    one. ``keep_answer=False`` (endpoints that handle clear identifiers): the attempt keeps
    only the masked shape of the answer, its ``answer_categories`` named; otherwise its text
    is kept masked, ``own_uuids`` (the UUIDs issued for the row it delivers) kept in it.
    ``on_delivered`` is the caller's, never the transport's: the loop runs it with the
    verdict once the attempt is recorded as delivered (ISI identifiers answer synchronously).
    """

    address: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    credential: Any = None
    check: Callable[[DeliveryResult], str | None] | None = None
    keep_answer: bool = True
    answer_categories: tuple[str, ...] = ()
    own_uuids: tuple[uuid.UUID, ...] = ()
    on_delivered: Callable[[Verdict], None] | None = None


@dataclass(frozen=True)
class Attempt:
    """What one attempt records (``DeliveryAttempt``'s fields, field for field)."""

    started: dt.datetime
    address: str
    request_headers: dict[str, str]  # as sent, credentials redacted
    status: int | None  # the target's status code, for a transport that has them
    duration_ms: int
    response: str  # what is kept of the answer
    error: str  # "" when none


@dataclass(frozen=True)
class Verdict:
    """What one message's attempt means.

    ``delivered``: done. ``retry``: try again on the schedule (``retry_after``: seconds the
    target asked to wait, which may lengthen it). ``gone``: the target is gone for good
    (``disable_reason``); it is disabled and its rows wait. ``failed``: it will never get
    through; no more attempts. ``failure`` is the one line staff see when it was not
    delivered; ``answer`` the whole answer as read, for ``Message.on_delivered``.
    """

    outcome: Outcome
    attempt: Attempt
    failure: str = ""
    retry_after: float | None = None
    disable_reason: str = ""
    answer: bytes = b""


class Transport(Protocol):
    """One kind of target (``kind``: ``Integration.kind``, or ``"saas"``).

    ``send`` makes one attempt of each message, on ``pool``'s threads when there is one
    (``each``), and returns their verdicts in the order of ``batch``. It never raises: a
    message that could not go is a verdict too. ``resolves``: its targets are also asked
    for a matched consumer's identifiers (an identifier retrieval per match, while the
    broker has a SaaS connection); a kind that cannot answer one says False, or its
    retrievals would wait for ever.
    """

    kind: str
    resolves: bool

    def send(self, batch: Sequence[Message], pool: Executor | None) -> list[Verdict]: ...


@runtime_checkable
class RequestMessages(Protocol):
    """A transport that also builds the messages of the requests a match hands an
    integration of its kind, from their rows alone: every kind of integration but ISI, whose
    messages need the database (its stored token, its answer recorded:
    ``services.dispatch.deliveries``). Matching makes an integration a target once its
    kind's transport builds its requests' messages."""

    def deletion_message(self, request: DeletionRequest) -> Message: ...

    def resolution_message(self, request: ResolutionRequest) -> Message: ...


def each(
    pool: Executor | None, send_one: Callable[[Message], Verdict], batch: Sequence[Message]
) -> list[Verdict]:
    """``send_one`` over the batch, on the pool's threads when there is one."""
    if pool is None:
        return [send_one(message) for message in batch]
    return list(pool.map(send_one, batch))


# -- HTTP, which today's three transports speak ---------------------------------------------


def http_post(message: Message, headers: Mapping[str, str]) -> Verdict:
    """One POST of ``message`` with ``headers`` (what the transport made of its own), and
    its verdict, the answer as ``answer_kept`` keeps it."""
    started = timezone.now()
    result = deliver(
        "POST",
        message.address,
        body=message.body,
        headers=dict(headers),
        allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
    )
    return http_verdict(message, answer_kept(message, result), headers=headers, started=started)


def answer_kept(message: Message, result: DeliveryResult) -> DeliveryResult:
    """``result`` as its attempt keeps it: its text with what looks like an identifier
    masked (``masking.free_text_masked``); or, ``keep_answer=False`` (the endpoint handles clear
    identifiers): ``response_body`` is only the ``masked`` shape of whatever was answered,
    an error included (an error may echo what was asked), keys as well as values but for
    the ``answer_categories`` asked and the protocol's names; ``content`` still holds it all.
    """
    if message.keep_answer:
        # Kept to tell why a call failed; a broker's error may still name the consumer
        # ("cannot delete ann@x.com"), masked as a callback's free text is, and quote the
        # token in the address's query ("Cannot POST /hook?code=T"), which only staff who
        # may change the target see: redacted first, as masking cuts only whole URLs.
        result = answer_redacted(result, url_extras_sent(message.address))
        kept = masking.free_text_masked(
            result.response_body, limit=RESPONSE_BODY_LIMIT, own_uuids=message.own_uuids
        )
        return dataclasses.replace(result, response_body=kept)
    return dataclasses.replace(
        result, response_body=masking.masked(result.content, categories=message.answer_categories)
    )


def answer_redacted(result: DeliveryResult, secrets: Iterable[str]) -> DeliveryResult:
    """``result`` with ``secrets`` redacted from ``response_body``, the text kept and shown,
    before it is masked (masking first could leave part of one in clear), and with what an
    earlier redaction took out (``result.redacted``). It is cut again from the answer
    redacted whole, so no secret is cut in two and kept in part; nor kept in part where the
    answer read ends (it may go on past what was read). ``content`` stays as answered: it is
    parsed, never kept as text, and a short secret taken out of it could break a connection
    list or identifiers that are right."""
    secrets = tuple(dict.fromkeys([*result.redacted, *(s for s in secrets if s)]))
    pattern = secrets_pattern(secrets)
    if pattern is None:
        return result
    answered = result.content.decode("utf-8", errors="replace")
    redacted = _without_secret_start_at_end(pattern.sub(REDACTED, answered), secrets)
    if redacted == answered:
        return dataclasses.replace(result, redacted=secrets)
    kept = storable(redacted.encode()[:RESPONSE_BODY_LIMIT].decode("utf-8", errors="ignore"))
    return dataclasses.replace(result, response_body=kept, redacted=secrets)


# A secret's start shorter than this tells nothing of it; longer, it is not kept.
_SECRET_START_KEPT = 4


def _without_secret_start_at_end(text: str, secrets: Iterable[str]) -> str:
    # An answer cut where it was read (a webhook's at 4 KiB) may end within a secret, whole
    # past the cut: not found to be redacted, its start would be kept.
    for secret in secrets:
        for length in range(len(secret) - 1, _SECRET_START_KEPT - 1, -1):
            if text.endswith(secret[:length]):
                return text[:-length]
    return text


def http_verdict(
    message: Message,
    result: DeliveryResult,
    *,
    headers: Mapping[str, str],
    started: dt.datetime,
) -> Verdict:
    """The verdict of one HTTP call (docs/contracts.md §6): a 2xx that arrived whole within
    the timeout is delivered, 410 is gone, anything else is retried (a 429 or 503 may ask
    for a longer wait with ``Retry-After``)."""
    outcome = classify(result.status, result.error)
    asked = None
    if outcome == "retry" and result.status in RETRY_AFTER_STATUSES:
        asked = retry_after_seconds(_header(result, "Retry-After"))
    return Verdict(
        outcome=outcome,
        attempt=Attempt(
            started=started,
            address=message.address,
            request_headers=redacted(headers),
            status=result.status,
            duration_ms=result.duration_ms,
            response=result.response_body,
            error=result.error or "",
        ),
        failure="" if outcome == "delivered" else _failure_text(result),
        retry_after=asked,
        disable_reason=f"410 Gone from {result.url}" if outcome == "gone" else "",
        answer=result.content,
    )


def redacted(headers: Mapping[str, str]) -> dict[str, str]:
    """What is kept of the request headers: everything but bearer tokens (signatures stay)."""
    return {k: (REDACTED if k.lower() == "authorization" else v) for k, v in headers.items()}


def _failure_text(result: DeliveryResult) -> str:
    if result.error:
        return result.error if result.status is None else f"{result.status}: {result.error}"
    return f"HTTP {result.status}"


def _header(result: DeliveryResult, name: str) -> str | None:
    # response_headers is a plain dict of the names as the server spelled them.
    wanted = name.lower()
    return next((v for k, v in result.response_headers.items() if k.lower() == wanted), None)
