"""The three kinds of deliverable, written plainly over the delivery loop
(``services.dispatch.delivery_loop``): deletion requests and resolution requests (to a webhook
integration, or to an ISI integration's own REST API) and SaaS deletions.

Jobs call the entry point of their kind with the ids they were given::

    deletion_requests_deliver(request_ids=[1, 2, 3])     # tasks.deliver_deletion_requests
    resolution_requests_deliver(request_ids=[4])         # tasks.deliver_resolution_requests
    saas_deletions_deliver(deletion_ids=[5])             # tasks.deliver_saas_deletions

Each kind has the loop's ``DeliveryKind`` protocol: its rows, and per row its target, ledger
subject and broker, its ``Message``, and its retry job. A request's message is built by its
target kind's transport (``dispatch.transports.request_messages``: a webhook's, signed with the
Webhook Secret as it leaves), but for ISI's, built here: they carry the bearer token
stored for the integration and the answer's check (``dispatch.isi``) and, for the
synchronous identifier retrieval, an ``on_delivered`` that records the answer once its
attempt is recorded. A SaaS deletion is a POST with the connection's token, completed by
its 2xx. A new kind of target changes nothing here (docs/architecture.md walks it).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from integrations import enqueue
from integrations.dispatch import isi, masking, webhook
from integrations.dispatch.saas import categories_or_default, saas_deletion_payload, saas_headers
from integrations.dispatch.transport import Message, Verdict
from integrations.dispatch.transports import request_messages
from integrations.models import (
    DeletionRequest,
    Integration,
    IntegrationKind,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItemState,
)
from integrations.services.cycle.isi_tokens import isi_delivery_token
from integrations.services.dispatch.delivery_loop import NothingToDeliver, deliverables_deliver
from integrations.services.dispatch.resolutions import (
    recurring_marks,
    resolution_outcome_record,
    resolution_settle,
)
from integrations.services.ledger import SYSTEM_ACTOR


def _isi_outbound(
    integration: Integration,
    url: str,
    body: bytes,
    *,
    check: isi.AnswerCheck | None,
    keep_answer: bool = True,
    answer_categories: tuple[str, ...] = (),
    own_uuids: tuple[uuid.UUID, ...] = (),
    on_delivered: Callable[[Verdict], None] | None = None,
) -> Message:
    # The token is had here, on the thread holding the batch's transaction, which may store
    # a new one; the sending thread only renews it over HTTP after a 401.
    return Message(
        address=url,
        body=body,
        headers=isi.request_headers(),
        credential=isi_delivery_token(integration),
        check=check,
        on_delivered=on_delivered,
        keep_answer=keep_answer,
        answer_categories=answer_categories,
        own_uuids=own_uuids,
    )


def saas_identifier_categories(*, broker_id: int) -> list[str]:
    """``identifier_categories`` of an ISI identifier retrieval: the union of the broker's
    SaaS connections' categories (each defaulting to email), a disabled one's included: its
    deletions wait for it with the identifiers they need."""
    categories: dict[str, None] = {}
    for own in SaasConnection.objects.filter(
        broker_id=broker_id, retired_at__isnull=True
    ).values_list("identifier_categories", flat=True):
        categories.update(dict.fromkeys(categories_or_default(own)))
    return sorted(categories) or list(categories_or_default([]))


# -- deletion requests ----------------------------------------------------------------------


def isi_deletion_outbound(request: DeletionRequest) -> Message:
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
        own_uuids=masking.row_own_uuids(request),  # its answer is kept as text: ours kept in it
    )


class DeletionRequests:
    """Deletion dispatches (body §2.1), acknowledged by a 2xx, completed by the callback."""

    name: str = "deletion_request"
    model: type[DeletionRequest] = DeletionRequest
    attempt_field: str = "deletion_request"
    related: tuple[str, ...] = ("integration", "isi_connection")
    acknowledged_state: str = RequestState.DISPATCHED.value

    def target(self, item: DeletionRequest) -> Integration | None:
        return item.integration

    def subject(self, item: DeletionRequest) -> str:
        return str(item.request_uuid)

    def broker_id(self, item: DeletionRequest) -> str:
        return item.broker_id_code

    def ledger_data(self, item: DeletionRequest) -> dict[str, Any]:
        return {"webhook_request_id": str(item.webhook_request_id)}

    def outbound(self, item: DeletionRequest) -> Message | None:
        if item.integration is None:
            return None
        if item.integration.kind == IntegrationKind.ISI:
            return isi_deletion_outbound(item)
        transport = request_messages(item.integration.kind)
        return None if transport is None else transport.deletion_message(item)

    def enqueue(self, ids: Sequence[int], /, *, at: dt.datetime | None = None) -> None:
        enqueue.deletion_requests_enqueue(ids, at=at)

    def after_final(self, item: DeletionRequest) -> None:
        """Nothing: its outcome, recorded by the callback, settles its work item."""

    def settles(self, item: DeletionRequest) -> tuple[int, int]:
        return (item.work_item_id or 0, item.pk)  # a canary's has no work item


DELETION_REQUESTS = DeletionRequests()


def deletion_requests_deliver(
    *, request_ids: Sequence[int], threads: int | None = None
) -> Counter[str]:
    """Deliver the deletion requests among ``request_ids`` that are due (body §2.1)."""
    return deliverables_deliver(kind=DELETION_REQUESTS, ids=request_ids, threads=threads)


# -- resolution requests --------------------------------------------------------------------


def isi_resolution_outbound(request: ResolutionRequest) -> Message:
    """The ISI identifier retrieval (§2.6) for the categories the broker's SaaS connections
    delete by; its synchronous answer is recorded as the webhook resolution callback's is,
    which starts the SaaS deletions."""
    integration, connection_ = request.integration, request.isi_connection
    assert connection_ is not None
    categories = saas_identifier_categories(broker_id=request.broker_id)

    def record_answer(verdict: Verdict) -> None:
        resolution_outcome_record(
            resolution_request=request,
            drop_outcome="",
            exemption_basis="",
            identifiers=isi.identifiers_of(verdict.answer),  # checked already by the send
            actor=SYSTEM_ACTOR,
        )

    return _isi_outbound(
        integration,
        isi.endpoint(integration.base_url, isi.IDENTIFIERS_PATH, connection_.uuid),
        isi.identifiers_body(request, categories),
        check=isi.identifiers_answer_error,
        keep_answer=False,  # clear identifiers: the attempt keeps only their shape
        answer_categories=tuple(categories),
        own_uuids=masking.row_own_uuids(request),  # a failure's text: ours kept in it
        on_delivered=record_answer,
    )


class ResolutionRequests:
    """Identifier retrieval notifications (body §2.3), answered by the resolution callback
    (an ISI integration answers at once, ``isi_resolution_outbound``)."""

    name: str = "resolution_request"
    model: type[ResolutionRequest] = ResolutionRequest
    attempt_field: str = "resolution_request"
    related: tuple[str, ...] = ("integration", "broker", "isi_connection")
    acknowledged_state: str = RequestState.DISPATCHED.value

    def target(self, item: ResolutionRequest) -> Integration | None:
        return item.integration

    def subject(self, item: ResolutionRequest) -> str:
        return str(item.request_uuid)

    def broker_id(self, item: ResolutionRequest) -> str:
        return item.broker.broker_id

    def ledger_data(self, item: ResolutionRequest) -> dict[str, Any]:
        return {"webhook_request_id": str(item.webhook_request_id)}

    def outbound(self, item: ResolutionRequest) -> Message | None:
        if item.integration.kind == IntegrationKind.ISI:
            return isi_resolution_outbound(item)
        transport = request_messages(item.integration.kind)
        return None if transport is None else transport.resolution_message(item)

    def enqueue(self, ids: Sequence[int], /, *, at: dt.datetime | None = None) -> None:
        enqueue.resolution_requests_enqueue(ids, at=at)

    def after_final(self, item: ResolutionRequest) -> None:
        """Nothing: recording its answer settles its work item."""

    def settles(self, item: ResolutionRequest) -> tuple[int, int]:
        return (item.work_item_id, item.pk)


RESOLUTION_REQUESTS = ResolutionRequests()


def resolution_requests_deliver(
    *, request_ids: Sequence[int], threads: int | None = None
) -> Counter[str]:
    """Deliver the identifier retrieval notifications (body §2.3) that are due."""
    return deliverables_deliver(kind=RESOLUTION_REQUESTS, ids=request_ids, threads=threads)


# -- SaaS deletions -------------------------------------------------------------------------


def saas_deletion_outbound(deletion: SaasDeletion) -> Message:
    resolution = deletion.resolution
    if resolution.work_item.state == WorkItemState.REMOVED:
        # The import cancels those it can lock; one a batch held then (to skip it, or
        # waiting for a dispatch slot) is caught here, before anything leaves.
        raise NothingToDeliver("work item removed by DROP (consumer cancelled)")
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
    return Message(
        address=connection_.url,
        body=webhook.encode(payload),
        headers=saas_headers(connection_.token),
        keep_answer=False,  # it sends clear identifiers: an answer may echo them
        answer_categories=tuple(categories_or_default(connection_.identifier_categories)),
        own_uuids=masking.row_own_uuids(deletion),  # a failure's text: ours kept in it
    )


class SaasDeletions:
    """SaaS deletions: the SaaS answers synchronously, so its 2xx is the deletion done (there
    is no callback), and a final one may purge its resolution's identifiers."""

    name: str = "saas_deletion"
    model: type[SaasDeletion] = SaasDeletion
    attempt_field: str = "saas_deletion"
    related: tuple[str, ...] = (
        "resolution",
        "resolution__broker",
        "resolution__work_item",
        "saas_connection",
    )
    acknowledged_state: str = RequestState.COMPLETED.value

    def target(self, item: SaasDeletion) -> SaasConnection:
        return item.saas_connection

    def subject(self, item: SaasDeletion) -> str:
        return str(item.resolution.request_uuid)

    def broker_id(self, item: SaasDeletion) -> str:
        return item.resolution.broker.broker_id

    def ledger_data(self, item: SaasDeletion) -> dict[str, Any]:
        return {
            "saas_deletion": item.pk,
            "saas_connection": item.saas_connection.name,
            # Its resolution's recurring round, as the resolution's own outcome is marked.
            **recurring_marks(item.resolution.round),
        }

    def outbound(self, item: SaasDeletion) -> Message:
        return saas_deletion_outbound(item)

    def enqueue(self, ids: Sequence[int], /, *, at: dt.datetime | None = None) -> None:
        enqueue.saas_deletions_enqueue(ids, at=at)

    def after_final(self, item: SaasDeletion) -> None:
        resolution_settle(resolution_id=item.resolution_id)

    def settles(self, item: SaasDeletion) -> tuple[int, int]:
        return (item.resolution.work_item_id, item.resolution_id)


SAAS_DELETIONS = SaasDeletions()


def saas_deletions_deliver(
    *, deletion_ids: Sequence[int], threads: int | None = None
) -> Counter[str]:
    """Send the SaaS deletions among ``deletion_ids`` that are due."""
    return deliverables_deliver(kind=SAAS_DELETIONS, ids=deletion_ids, threads=threads)
