"""Webhook notifications to the broker: the exact bodies of docs/contracts.md §2.1 and
§2.3, and their signed headers (§3.1).

Pure: no database access; the caller passes the rows it already loaded (a request's
integration and broker loaded with it, as the delivery loop does)::

    body = deletion_dispatch_body(request, integration)        # body §2.1, bytes
    headers = webhook_headers(integration.webhook_secret, body,
                              webhook_request_id=request.webhook_request_id)
    deliver("POST", integration.url, body=body, headers=headers, allow_private=...)

Bodies are compact JSON (UTF-8, no ASCII escaping); the signature covers these exact bytes,
so they are serialised once per attempt and never re-encoded after signing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

from django.conf import settings

from integrations.dispatch import masking, signing
from integrations.dispatch.transport import Message, Verdict, each, http_post
from integrations.models import DeletionRequest, Integration, ResolutionRequest
from integrations.outbound_http import USER_AGENT

WEBHOOK_ID_HEADER = "X-Webhook-Id"
DELETION_CALLBACK_PATH = "/api/v1/drop/callbacks/deletion"
RESOLUTION_CALLBACK_PATH = "/api/v1/drop/callbacks/resolution"


def deletion_callback_url() -> str:
    """``webhook_callback_url`` of a deletion dispatch (docs/contracts.md §2.1)."""
    return settings.DROPPORTAL_PUBLIC_URL + DELETION_CALLBACK_PATH


def resolution_callback_url() -> str:
    """``webhook_callback_url`` of an identifier retrieval notification."""
    return settings.DROPPORTAL_PUBLIC_URL + RESOLUTION_CALLBACK_PATH


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def deletion_dispatch_payload(request: DeletionRequest, integration: Integration) -> dict[str, Any]:
    """Body §2.1, field for field, in the order of its table."""
    payload: dict[str, Any] = {
        "integration_name": integration.name,
        "integration_kind": "webhook",
        "webhook_request_id": str(request.webhook_request_id),
        "request_type": "drop_deletion",
        "topic": "drop.deletion:create",
        "request_uuid": str(request.request_uuid),
        "integration_id": str(integration.uuid),
        "identifier_hash": request.identifier_hash,
        "hash_type": request.hash_type,
        "drop_session_id": request.drop_session_id,
        "match_date": request.match_date.isoformat(),
        "broker_id": request.broker_id_code,
        "mode": request.mode,
    }
    if request.remote_identifier:  # "Omitted when none was provided."
        payload["remote_identifier"] = request.remote_identifier
    payload["webhook_callback_url"] = deletion_callback_url()
    return payload


def deletion_dispatch_body(request: DeletionRequest, integration: Integration) -> bytes:
    return encode(deletion_dispatch_payload(request, integration))


def resolution_notification_payload(
    request: ResolutionRequest, integration: Integration
) -> dict[str, Any]:
    """Body §2.3, field for field (four fields mean what they do in §2.1). Every field is the
    request's own, fixed when it was made, or the integration's, as in §2.1: the broker's
    mode changed between two attempts does not change a retry's body."""
    return {
        "integration_name": integration.name,
        "integration_kind": "webhook",
        "webhook_request_id": str(request.webhook_request_id),
        "request_type": "drop_resolution",
        "topic": "drop.resolution:create",
        "request_uuid": str(request.request_uuid),
        "integration_id": str(integration.uuid),
        "results_token": request.results_token,
        "broker_id": request.broker_id_code,
        "drop_session_id": request.drop_session_id,
        "match_date": request.match_date.isoformat(),
        "mode": request.mode,
        "identifiers": {"external_id": [{"external_id": request.remote_identifier}]},
        "webhook_callback_url": resolution_callback_url(),
    }


def resolution_notification_body(request: ResolutionRequest, integration: Integration) -> bytes:
    return encode(resolution_notification_payload(request, integration))


def unsigned_headers(*, webhook_request_id: uuid.UUID | str) -> dict[str, str]:
    """The headers of a notification but its signature (``X-Webhook-Id``: the same on retries)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        WEBHOOK_ID_HEADER: str(webhook_request_id),
    }


def webhook_headers(
    secret: str, body: bytes, *, webhook_request_id: uuid.UUID | str, now: float | None = None
) -> dict[str, str]:
    """Every header of a notification; a fresh timestamp and signature on each call."""
    return {
        **unsigned_headers(webhook_request_id=webhook_request_id),
        **signing.signed_headers(secret, body, now=now),
    }


class WebhookTransport:
    """A signed POST (``Message.credential``: the integration's Webhook Secret), signed on the
    sending thread right before it leaves, so the timestamp is fresh however long the call
    waited for a thread. It builds its own requests' messages: body §2.1 and the
    notification §2.3."""

    kind = "webhook"
    resolves = True

    def deletion_message(self, request: DeletionRequest) -> Message:
        integration = request.integration
        assert integration is not None
        body = deletion_dispatch_body(request, integration)
        # Its answer is kept as text: the UUIDs it was sent with, ours, are kept in it.
        own = masking.row_own_uuids(request)
        return _unsigned(integration, body, request.webhook_request_id, own_uuids=own)

    def resolution_message(self, request: ResolutionRequest) -> Message:
        integration = request.integration
        body = resolution_notification_body(request, integration)
        # It asks for the consumer's identifiers: a broker may answer with them here rather
        # than in the callback, so the attempt keeps only the answer's shape (only the 2xx
        # counts), as for an ISI identifier retrieval.
        # A failure's text is still kept as text: ours kept in it.
        return _unsigned(
            integration,
            body,
            request.webhook_request_id,
            keep_answer=False,
            own_uuids=masking.row_own_uuids(request),
        )

    def send(self, batch: Sequence[Message], pool: Executor | None) -> list[Verdict]:
        return each(pool, self._post, batch)

    def _post(self, message: Message) -> Verdict:
        signed = signing.signed_headers(message.credential, message.body)
        return http_post(message, {**message.headers, **signed})


def _unsigned(
    integration: Integration,
    body: bytes,
    webhook_request_id: uuid.UUID,
    *,
    keep_answer: bool = True,
    own_uuids: tuple[uuid.UUID, ...] = (),
) -> Message:
    # Signed by send as it leaves: a fresh timestamp on each attempt.
    return Message(
        address=integration.url,
        body=body,
        headers=unsigned_headers(webhook_request_id=webhook_request_id),
        credential=integration.webhook_secret,
        keep_answer=keep_answer,
        own_uuids=own_uuids,
    )
