"""The broker's outcome callbacks of the webhook pattern (docs/contracts.md §3.1):

- ``PUT /api/v1/drop/callbacks/deletion``: body §2.2, correlated by ``request_uuid``;
- ``PUT /api/v1/drop/callbacks/resolution``: body §2.4, correlated by ``results_token``.

Both go through ``SignedCallbackView`` (key, scope, rate, size, signature, timestamp; see
``callback_auth``), then record the outcome through one service. Signed like this::

    body = b'{"schema_version":"1.0","status":"completed","request_uuid":"…",'
           b'"drop_outcome":"deleted"}'
    ts = str(int(time.time()))
    sig = base64(hmac_sha256(webhook_secret, ts + ":" + body))
    PUT with Authorization: Bearer <key>, X-Webhook-Timestamp: ts, X-Webhook-Signature: sig
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from integrations.api.callback_auth import SignedCallbackView
from integrations.api.callback_serializers import (
    CallbackRecordedSerializer,
    DeletionCallbackSerializer,
    ProblemSerializer,
    ResolutionCallbackSerializer,
    deletion_callback_validated,
    opt_out_email,
)
from integrations.models import ApiKey, IntegrationKind, ResolutionRequest
from integrations.services.dispatch.outcomes import (
    OutcomeConflict,
    OutcomeRecorded,
    deletion_outcome_record,
)
from integrations.services.dispatch.resolutions import resolution_outcome_record
from integrations.web.errors import Problem
from integrations.wire_fields import CanonicalUUIDField, uuid_from_text

_PROBLEMS = {
    400: OpenApiResponse(ProblemSerializer, description="validation_failed, with errors by field"),
    401: OpenApiResponse(
        ProblemSerializer,
        description="authentication_failed, signature_invalid or timestamp_out_of_range",
    ),
    403: OpenApiResponse(ProblemSerializer, description="scope_missing (webhook_callback)"),
    404: OpenApiResponse(ProblemSerializer, description="not_found (also another broker's)"),
    409: OpenApiResponse(ProblemSerializer, description="outcome_conflict"),
    413: OpenApiResponse(ProblemSerializer, description="payload_too_large (over 64 KiB)"),
    429: OpenApiResponse(ProblemSerializer, description="rate_limited; see Retry-After"),
    503: OpenApiResponse(
        ProblemSerializer,
        description="database_unavailable or overloaded; retry after Retry-After",
    ),
}
_RECORDED = OpenApiResponse(
    CallbackRecordedSerializer,
    description="Recorded; or unchanged when the same outcome was already recorded.",
)


class OutcomeConflictProblem(Problem):
    """409 ``outcome_conflict``; its ledger event says what was there and what was refused."""

    def __init__(self, exc: OutcomeConflict) -> None:
        super().__init__(status=409, code="outcome_conflict", detail=exc.detail)
        self.ledger_data = {"current": exc.current, "attempted": exc.attempted}


def _recorded(result: OutcomeRecorded) -> Response:
    return Response(
        {
            "status": "recorded" if result.changed else "unchanged",
            "request_uuid": result.request_uuid,
            "drop_outcome": result.drop_outcome,
        }
    )


class DeletionCallbackView(SignedCallbackView):
    """The broker reports what it did with a deletion dispatch."""

    callback = "deletion"
    integration_kind = IntegrationKind.WEBHOOK

    def correlation(self, payload: dict[str, Any]) -> str | None:
        request_uuid = uuid_from_text(payload.get("request_uuid"))
        return None if request_uuid is None else str(request_uuid)

    @extend_schema(
        summary="Report a deletion outcome (body 2.2)",
        request=DeletionCallbackSerializer,
        responses={200: _RECORDED, **_PROBLEMS},
        examples=[
            OpenApiExample(
                "deleted",
                request_only=True,
                value={
                    "schema_version": "1.0",
                    "status": "completed",
                    "request_uuid": "3f2c8a8e-6a4b-4c1e-9a57-0c5d2f1e9b10",
                    "drop_outcome": "deleted",
                },
            ),
            OpenApiExample(
                "opted_out",
                request_only=True,
                value={
                    "schema_version": "1.0",
                    "status": "completed",
                    "request_uuid": "3f2c8a8e-6a4b-4c1e-9a57-0c5d2f1e9b10",
                    "drop_outcome": "opted_out",
                    "identifiers": {"email": [{"email": "Ann.Smith@Example.com"}]},
                },
            ),
        ],
    )
    def put(self, request: Request) -> Response:
        payload = self.json_object(request)
        sent = payload.get("request_uuid")
        request_uuid = uuid_from_text(sent)
        if request_uuid is None and isinstance(sent, str) and _any_uuid(sent):
            # Another spelling of the same UUID (braces, urn:uuid:, no dashes) is told so,
            # not "required": the request is named by the text its dispatch sent.
            raise Problem(
                status=400,
                code="validation_failed",
                detail="request_uuid must be echoed as the dispatch wrote it: hexadecimal "
                "digits, 8-4-4-4-12.",
                errors={"request_uuid": [_CANONICAL_UUID]},
            )
        if request_uuid is None:
            raise Problem(
                status=400,
                code="validation_failed",
                detail="request_uuid is required: the UUID of the dispatch this answers.",
                errors={"request_uuid": ["A UUID string is required."]},
            )
        deletion_request = self.deletion_request  # found with the API key
        if deletion_request is None:
            raise self.not_found(f"deletion request {request_uuid}")
        self.subject = str(request_uuid)
        assert deletion_request.integration is not None  # found with its integration
        self.verify_signature(request, deletion_request.integration)
        attrs = deletion_callback_validated(payload)
        try:
            result = deletion_outcome_record(
                deletion_request=deletion_request,
                drop_outcome=attrs["drop_outcome"],
                error_message=attrs.get("error_message") or "",
                opt_out_email=opt_out_email(attrs),
                actor=self.actor(request),
            )
        except OutcomeConflict as exc:
            raise OutcomeConflictProblem(exc) from None
        return _recorded(result)


class ResolutionCallbackView(SignedCallbackView):
    """The broker answers an identifier retrieval notification with clear identifiers."""

    callback = "resolution"

    @extend_schema(
        summary="Answer an identifier retrieval notification (body 2.4)",
        request=ResolutionCallbackSerializer,
        responses={200: _RECORDED, **_PROBLEMS},
        examples=[
            OpenApiExample(
                "resolved",
                request_only=True,
                value={
                    "status": "completed",
                    "results_token": "9f86d081884c7d659a2feaa0c55ad015"
                    "a3bf4f1b2b0b822cd15d6c15b0f00a08",
                    "identifiers": {"email": [{"email": "Ann.Smith@Example.com"}]},
                },
            ),
        ],
    )
    def put(self, request: Request) -> Response:
        payload = self.json_object(request)
        token = payload.get("results_token")
        if not isinstance(token, str) or not token:
            raise Problem(
                status=400,
                code="validation_failed",
                detail="results_token is required: the token of the notification this answers.",
                errors={"results_token": ["A string is required."]},
            )
        api_key = request.auth
        assert isinstance(api_key, ApiKey)
        assert api_key.broker_id is not None  # only a metrics key has none, and only that scope
        resolution_request = (
            ResolutionRequest.objects.select_related("integration", "broker")
            .filter(
                results_token=token,
                broker_id=api_key.broker_id,
                # One asked of an ISI connection was answered in its own call.
                isi_connection__isnull=True,
            )
            .first()
        )
        if resolution_request is None:
            raise self.not_found("resolution request with this results_token")
        self.subject = str(resolution_request.request_uuid)
        self.verify_signature(request, resolution_request.integration)
        serializer = ResolutionCallbackSerializer(data=payload)
        serializer.is_valid(raise_exception=True)
        attrs: dict[str, Any] = serializer.validated_data
        try:
            result = resolution_outcome_record(
                resolution_request=resolution_request,
                drop_outcome=attrs.get("drop_outcome") or "",
                exemption_basis=attrs.get("exemption_basis") or "",
                identifiers=attrs.get("identifiers") or {},
                opt_out_email=opt_out_email(attrs),
                actor=self.actor(request),
            )
        except OutcomeConflict as exc:
            raise OutcomeConflictProblem(exc) from None
        return _recorded(result)


_CANONICAL_UUID = str(CanonicalUUIDField.default_error_messages["invalid"])


def _any_uuid(text: str) -> bool:
    """Whether Python reads ``text`` as a UUID in some spelling (upper case, braces, ...)."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
