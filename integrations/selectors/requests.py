"""Deletion requests that need staff, and what the automatic redispatch policy did."""

from __future__ import annotations

import datetime as dt

from django.db.models import CharField, Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Cast, Coalesce

from integrations.dispatch.policy import AUTO_REDISPATCH_ACTOR
from integrations.ledger_kinds import LedgerKind
from integrations.models import DeletionRequest, LedgerEvent, RequestState

AWAITING_CALLBACK_ATTENTION = dt.timedelta(days=7)


def deletion_requests_needing_attention(*, now: dt.datetime) -> QuerySet[DeletionRequest]:
    """Failed or undeliverable requests, and those awaiting a callback for over a week."""
    return DeletionRequest.objects.filter(
        Q(state__in=[RequestState.FAILED, RequestState.UNDELIVERABLE])
        | Q(state=RequestState.DISPATCHED, dispatched_at__lt=now - AWAITING_CALLBACK_ATTENTION)
    )


def automatic_redispatches() -> Coalesce:
    """For deletion requests: how often the automatic policy redispatched each one, counted
    from its ``deletion_request.redispatched`` ledger events by ``AUTO_REDISPATCH_ACTOR``."""
    count = (
        LedgerEvent.objects.filter(
            kind=LedgerKind.DELETION_REQUEST_REDISPATCHED,
            actor=AUTO_REDISPATCH_ACTOR,
            subject=Cast(OuterRef("request_uuid"), CharField()),
        )
        .order_by()
        .values("subject")
        .annotate(n=Count("id"))
        .values("n")
    )
    return Coalesce(Subquery(count), 0)
