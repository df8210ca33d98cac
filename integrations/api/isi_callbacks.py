"""The broker's completion callback of the ISI pattern: ``PUT`` or ``POST
/api/v1/drop/callbacks/isi`` (the ``callback_path`` sent with each ISI delete), correlated by
``results_token``.

The same checks, rules, status codes and idempotency as the webhook deletion callback: the
shared ``SignedCallbackView`` (API key of scope ``webhook_callback`` of the request's broker,
signature by the ISI integration's Webhook Secret, timestamp within 5 minutes, 64 KiB), the
deletion callback's validation rules, and ``deletion_outcome_record``::

    body = b'{"status":"completed","results_token":"9f86…","drop_outcome":"deleted",'
           b'"completed_at":"2026-11-21T10:04:00Z"}'
    ts = str(int(time.time()))
    sig = base64(hmac_sha256(webhook_secret, ts + ":" + body))
    PUT (or POST) with Authorization: Bearer <key>, X-Webhook-Timestamp: ts,
    X-Webhook-Signature: sig
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from integrations.api.callback_auth import SignedCallbackView
from integrations.api.callback_serializers import DeletionCallbackSerializer, opt_out_email
from integrations.api.callbacks import _PROBLEMS, _RECORDED, OutcomeConflictProblem, _recorded
from integrations.models import IntegrationKind
from integrations.services.dispatch.outcomes import (
    OutcomeConflict,
    broker_completed_at_refusal,
    deletion_outcome_record,
)
from integrations.web.errors import Problem
from integrations.wire_fields import StrictCharField


@extend_schema_field(OpenApiTypes.DATETIME)
class UtcTimestampField(serializers.Field):
    """An ISO 8601 timestamp in UTC (``Z`` or ``+00:00``), as a JSON string; an RFC 3339
    one with ``t`` and ``z`` in lower case too, as the outcomes API takes it."""

    default_error_messages = {
        "invalid": "An ISO 8601 timestamp in UTC is required, e.g. 2026-11-21T10:04:00Z."
    }

    def to_internal_value(self, data: Any) -> dt.datetime:
        try:
            # Capitals: RFC 3339 allows a lowercase t and z, which Python refuses.
            moment = parse_datetime(data.upper()) if isinstance(data, str) else None
        except ValueError:  # well formed, but no such time: 30 February, 25 o'clock
            moment = None
        if moment is None or moment.utcoffset() != dt.timedelta(0):
            self.fail("invalid")
        return moment

    def to_representation(self, value: dt.datetime) -> str:
        return value.isoformat()


class IsiCallbackSerializer(DeletionCallbackSerializer):
    """The ISI DROP delete callback body (docs/contracts.md §2.6): the deletion callback's
    fields and rules (``failed`` needs ``error_message``, ``opted_out`` needs
    ``identifiers.email[0].email``), correlated by ``results_token`` and dated by
    ``completed_at``."""

    # DRF removes an inherited field declared None: the ISI body has neither.
    schema_version = None  # type: ignore[assignment]
    request_uuid = None  # type: ignore[assignment]
    results_token = StrictCharField(max_length=64)
    completed_at = UtcTimestampField()


_EXAMPLES = [
    OpenApiExample(
        "deleted",
        request_only=True,
        value={
            "status": "completed",
            "results_token": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "drop_outcome": "deleted",
            "completed_at": "2026-11-21T10:04:00Z",
        },
    ),
    OpenApiExample(
        "opted_out",
        request_only=True,
        value={
            "status": "completed",
            "results_token": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "drop_outcome": "opted_out",
            "identifiers": {"email": [{"email": "Ann.Smith@Example.com"}]},
            "completed_at": "2026-11-21T10:04:00Z",
        },
    ),
]


class IsiCallbackView(SignedCallbackView):
    """The broker reports that it completed an ISI DROP delete."""

    callback = "isi"
    integration_kind = IntegrationKind.ISI

    def correlation(self, payload: dict[str, Any]) -> str | None:
        token = payload.get("results_token")
        return token if isinstance(token, str) and token else None

    @extend_schema(
        summary="Complete an ISI DROP delete (ISI callback body)",
        request=IsiCallbackSerializer,
        responses={200: _RECORDED, **_PROBLEMS},
        examples=_EXAMPLES,
    )
    def put(self, request: Request) -> Response:
        return self._complete(request)

    @extend_schema(
        summary="Complete an ISI DROP delete (the same, by POST)",
        request=IsiCallbackSerializer,
        responses={200: _RECORDED, **_PROBLEMS},
        examples=_EXAMPLES,
    )
    def post(self, request: Request) -> Response:
        return self._complete(request)

    def _complete(self, request: Request) -> Response:
        payload = self.json_object(request)
        token = payload.get("results_token")
        if not isinstance(token, str) or not token:
            raise Problem(
                status=400,
                code="validation_failed",
                detail="results_token is required: the token of the delete this completes.",
                errors={"results_token": ["A string is required."]},
            )
        deletion_request = self.deletion_request  # found with the API key
        if deletion_request is None:
            raise self.not_found("ISI delete with this results_token")
        self.subject = str(deletion_request.request_uuid)
        assert deletion_request.integration is not None  # found with its integration
        self.verify_signature(request, deletion_request.integration)
        serializer = IsiCallbackSerializer(data=payload)
        serializer.is_valid(raise_exception=True)
        attrs = serializer.validated_data
        refusal = broker_completed_at_refusal(
            deletion_request=deletion_request, completed_at=attrs["completed_at"]
        )
        if refusal:
            raise Problem(
                status=400,
                code="validation_failed",
                detail=refusal,
                errors={"completed_at": [refusal]},
            )
        try:
            result = deletion_outcome_record(
                deletion_request=deletion_request,
                drop_outcome=attrs["drop_outcome"],
                error_message=attrs.get("error_message") or "",
                opt_out_email=opt_out_email(attrs),
                actor=self.actor(request),
                # Kept as data: the ledger and the request are dated by our clock.
                broker_completed_at=attrs["completed_at"],
            )
        except OutcomeConflict as exc:
            raise OutcomeConflictProblem(exc) from None
        return _recorded(result)
