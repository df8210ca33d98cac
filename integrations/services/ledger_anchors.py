"""Anchoring the ledger outside the service: an RFC 3161 time-stamping authority
(``DROPPORTAL_TSA_URL``) signs the chain hash at the head, and its token is kept::

    anchor = ledger_anchor(actor="cli:alice")   # seal, ask the authority, keep its token
    checked, problems = ledger_anchors_verify(authorities=load_certificates(ca_pem))
    ledger_anchors_verify_record()   # the nightly check, kept as an event (alerts on a problem)

A token is the authority's word that the chain had reached that hash by its time: a chain
rewritten later (even by someone holding the database and the evidence key) no longer leads
to a hash an authority signed. Each anchoring is a ``ledger.anchored`` event; a failed one a
``ledger.anchor_failed`` event (which raises the ``ledger_anchor_failed`` alert) and an
``AnchorFailed`` for the caller, so the worker's job is tried again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from integrations.evidence.timestamps import (
    CONTENT_TYPE_QUERY,
    timestamp_request,
    token_chain_problem,
    token_gen_time,
    token_problem,
)
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerAnchor, LedgerChainLink
from integrations.outbound_http import deliver
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append, ledger_seal
from integrations.url_extras import without_url_extras

if TYPE_CHECKING:
    from cryptography import x509

# A token with the signer's certificate is a few KiB; an authority adding its chain, more.
TOKEN_READ_LIMIT = 64 << 10


class AnchorNotConfigured(Exception):
    """No ``DROPPORTAL_TSA_URL``: there is no authority to ask."""


class AnchorFailed(Exception):
    """The authority could not be asked, or did not answer with a token over the head."""


def ledger_anchor(*, actor: str = SYSTEM_ACTOR) -> LedgerAnchor:
    """Seal the ledger, have the authority timestamp the chain head, keep its token."""
    url = settings.DROPPORTAL_TSA_URL
    if not url:
        raise AnchorNotConfigured(
            "DROPPORTAL_TSA_URL is not set: no time-stamping authority to anchor the ledger with"
        )
    ledger_seal()
    head = LedgerChainLink.objects.order_by("-position").first()
    if head is None:
        raise AnchorFailed("the ledger's chain is empty: nothing to anchor yet")
    request = timestamp_request(head.chain_hash)
    result = deliver(
        "POST",
        url,
        body=request.as_bytes(),
        headers={"Content-Type": CONTENT_TYPE_QUERY},
        allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
        read_limit=TOKEN_READ_LIMIT,
    )
    problem: str | None
    if result.error is not None or result.status != 200:
        problem = result.error or f"HTTP {result.status}"
    elif len(result.content) > TOKEN_READ_LIMIT:
        problem = f"its answer is longer than {TOKEN_READ_LIMIT} bytes"
    else:
        problem = token_problem(result.content, head.chain_hash, nonce=request.nonce)
    if problem is not None:
        _record_failure(head=head, url=url, problem=problem, actor=actor)
        # Printed by the command and logged by the job's retries: no token of its query.
        raise AnchorFailed(f"the time-stamping authority at {without_url_extras(url)}: {problem}")
    token = result.content
    with transaction.atomic():
        anchor = LedgerAnchor.objects.create(
            position=head.position,
            event_id=head.event_id,
            chain_hash=head.chain_hash,
            token=token,
            token_sha256=hashlib.sha256(token).hexdigest(),
            tsa_url=without_url_extras(url),  # a token in its query stays out of packs
            gen_time=token_gen_time(token),
            created_at=timezone.now(),
        )
        ledger_event_append(
            kind=LedgerKind.LEDGER_ANCHORED,
            actor=actor,
            subject="ledger",
            data={
                "position": anchor.position,
                "event_id": anchor.event_id,
                "chain_hash": anchor.chain_hash,
                "token_sha256": anchor.token_sha256,
                "gen_time": anchor.gen_time.isoformat(),
                "tsa_url": anchor.tsa_url,
            },
        )
    return anchor


def _record_failure(*, head: LedgerChainLink, url: str, problem: str, actor: str) -> None:
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.LEDGER_ANCHOR_FAILED,
            actor=actor,
            subject="ledger",
            data={
                "position": head.position,
                "chain_hash": head.chain_hash,
                "tsa_url": without_url_extras(url),
                "error": problem,
            },
        )


@dataclass(frozen=True)
class AnchorProblem:
    anchor_id: int
    position: int
    reason: str

    def __str__(self) -> str:
        return f"the token of position {self.position} (anchor {self.anchor_id}): {self.reason}"


def ledger_anchors_verify(
    *, authorities: list[x509.Certificate] | None = None
) -> tuple[int, list[AnchorProblem]]:
    """Check every kept token: it parses and covers the chain hash stored with it, that hash
    is the chain's at its position (``ledger verify`` recomputed the chain first), and with
    ``authorities`` its signature chains to one of them. How many were checked, and what
    failed."""
    problems: list[AnchorProblem] = []
    checked = 0
    # Each token with the chain's hash at its position, in one statement: read apart, a token
    # kept between the two reads (an anchoring at that moment) met no hash of the chain
    # and was reported as a chain rewritten.
    at_position = LedgerChainLink.objects.filter(position=OuterRef("position")).values(
        "chain_hash"
    )[:1]
    anchors = LedgerAnchor.objects.annotate(chain_at=Subquery(at_position)).order_by(
        "position", "id"
    )
    for anchor in anchors.iterator():
        checked += 1
        token = bytes(anchor.token)
        if anchor.chain_at != anchor.chain_hash:
            reason = "its chain hash is not the chain's at that position"
        elif authorities is None:
            reason = token_problem(token, anchor.chain_hash) or ""
        else:
            reason = token_chain_problem(token, anchor.chain_hash, authorities) or ""
        if reason:
            problems.append(AnchorProblem(anchor.id, anchor.position, reason))
    return checked, problems


def ledger_anchors_verify_record(*, actor: str = SYSTEM_ACTOR) -> bool:
    """``ledger_anchors_verify`` (without an authority's certificate: the service holds none),
    kept as a ``ledger.anchors_verified`` event; a problem raises the ``ledger_anchor_broken``
    alert. The nightly job's work, after ``ledger verify``: a chain rewritten whole, its
    hashes recomputed, passes that one but not this."""
    checked, problems = ledger_anchors_verify()
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.LEDGER_ANCHORS_VERIFIED,
            actor=actor,
            subject="ledger",
            data={
                "ok": not problems,
                "anchors_checked": checked,
                "problems": [str(problem) for problem in problems[:10]],
                "problems_count": len(problems),
            },
        )
    return not problems
