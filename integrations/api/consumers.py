"""Consumer registration for brokers' systems (scope ``ingest``; docs/contracts.md §8).

    POST /api/v1/drop/consumers
    {"consumers": [{"remote_identifier": "C-1", "email": ["anna@example.com"]}, ...]}
    200 {"accepted": 1, "rejected": []}

    DELETE /api/v1/drop/consumers/C-1                  204, or 404 not_found

Up to 10,000 consumers a call, with clear or Base64-hashed identifiers. A bad consumer is
answered in ``rejected`` (its index, pointer and errors by field) and the others are
registered; a malformed body, or more than 10,000 consumers, is a 400 ``validation_failed``
and nothing is written. Calls are idempotent. The key's broker is the broker. A 503 writes
nothing either: ``registration_busy`` (retry), or ``evidence_key_refused`` (a match owes the
service providers a directive that cannot be signed: staff must fix the evidence key).

The body is read by ``integrations.consumers.api_reader`` (the row rules of
``consumers.readers``, one pass, no per-field serializer objects for 10,000 consumers); the
serializers below describe it in the schema.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import IO, Any

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from integrations.api.callback_serializers import ProblemSerializer
from integrations.api.json_body import (
    JsonBodyParser,
    TooManyItems,
    json_object_body,
    read_capped,
)
from integrations.api.schema import JSON_VALUE_REF
from integrations.consumers.api_reader import parse_api_consumers
from integrations.evidence.signing_key import EvidenceKeyRefused
from integrations.models import ApiKey, Consumer
from integrations.services.cycle.consumers import (
    RegistrationBusy,
    consumer_forget,
    consumers_register,
)
from integrations.storable_text import unstorable_reason
from integrations.web.errors import Problem
from integrations.web.permissions import HasScope

MAX_CONSUMERS = 10_000
# An API call waits this long for a registration of the same broker (a file import can
# hold it for a while), and as long again for the broker's matching (a DROP import holds
# it through its own), then answers 503 with Retry-After.
LOCK_WAIT_SECONDS = 10.0
RETRY_AFTER_SECONDS = 30

logger = logging.getLogger(__name__)


# --- Schema ----------------------------------------------------------------------------


class NdzSerializer(serializers.Serializer):
    first_name = serializers.CharField()
    last_name = serializers.CharField()
    dob = serializers.CharField(help_text="YYYY-MM-DD, YYYYMMDD or MM/DD/YYYY")
    zip = serializers.CharField()


class NameVinSerializer(serializers.Serializer):
    first_name = serializers.CharField()
    last_name = serializers.CharField()
    vin = serializers.CharField(help_text="17 letters or digits")


class HashesSerializer(serializers.Serializer):
    """Pre-hashed identifiers: SHA-256 of the standardized value, standard Base64."""

    email = serializers.ListField(child=serializers.CharField(), required=False)
    phone = serializers.ListField(child=serializers.CharField(), required=False)
    ndz = serializers.ListField(child=serializers.CharField(), required=False)
    name_vin = serializers.ListField(child=serializers.CharField(), required=False)
    maid = serializers.ListField(child=serializers.CharField(), required=False)
    ctvid = serializers.ListField(child=serializers.CharField(), required=False)


class ConsumerSerializer(serializers.Serializer):
    remote_identifier = serializers.CharField(
        max_length=255, help_text="The broker's pointer to the consumer, sent back in dispatches."
    )
    remote_identifier_kind = serializers.CharField(
        required=False,
        help_text="What the pointer is; external_id for a new consumer when absent.",
    )
    email = serializers.ListField(child=serializers.CharField(), required=False)
    phone = serializers.ListField(child=serializers.CharField(), required=False)
    ndz = NdzSerializer(many=True, required=False)
    name_vin = NameVinSerializer(many=True, required=False)
    maid = serializers.ListField(child=serializers.CharField(), required=False)
    ctvid = serializers.ListField(child=serializers.CharField(), required=False)
    hashes = HashesSerializer(required=False)


class ConsumerItemField(serializers.JSONField):
    """One element of ``consumers``: any JSON value. A consumer object as ``Consumer``
    describes it is registered; anything else is answered in ``rejected``, row by row."""


class ConsumerItemFieldExtension(OpenApiSerializerFieldExtension):
    target_class = ConsumerItemField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        consumer = auto_schema.resolve_serializer(ConsumerSerializer, direction).ref
        return {
            "description": "A consumer; any other value is answered in `rejected` (200).",
            "anyOf": [consumer, JSON_VALUE_REF],
        }


class RegistrationRequestSerializer(serializers.Serializer):
    consumers = serializers.ListField(child=ConsumerItemField(), max_length=MAX_CONSUMERS)


class RegistrationRequestExtension(OpenApiSerializerExtension):
    target_class = RegistrationRequestSerializer

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_basic_serializer(self.target, direction)
        return {**schema, "additionalProperties": False}  # another key is a 400


class RejectedConsumerSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="Position in the request's consumers array.")
    remote_identifier = serializers.CharField(allow_null=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # Declared here: as a class attribute it would shadow Serializer.errors.
        fields["errors"] = serializers.DictField(
            child=serializers.ListField(child=serializers.CharField()),
            help_text="Messages by path of the bad value: email[1], ndz[0].dob, hashes.phone[0].",
        )
        return fields


class RegistrationResponseSerializer(serializers.Serializer):
    accepted = serializers.IntegerField(help_text="Consumers registered (or already were).")
    rejected = RejectedConsumerSerializer(many=True)


# --- Views -----------------------------------------------------------------------------


def _busy(exc: RegistrationBusy) -> Problem:
    return Problem(
        status=503,
        code="registration_busy",
        detail=f"{exc}; retry later.",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _unsigned(exc: EvidenceKeyRefused) -> Problem:
    # A consumer matched a DROP work item, and the directive the match owes the service
    # providers cannot be signed: the whole registration is rolled back, for staff to fix.
    # The reason (a setting's name, a file's path) is the operator's: logged, not answered.
    logger.error("consumer registration refused: %s", exc.message)
    return Problem(
        status=503,
        code="evidence_key_refused",
        detail=(
            "Nothing was registered: a consumer matched a DROP work item, and the directive "
            "the match owes the service providers cannot be signed right now (the operator "
            "has the reason in the service's log). Retry later."
        ),
    )


def _no_consumer() -> Problem:
    # Also for another broker's consumer: no existence leak.
    return Problem(status=404, code="not_found", detail="No consumer with this remote_identifier.")


class ConsumersBodyParser(JsonBodyParser):
    """The registration body, whose ``consumers`` are decoded one at a time: the call is
    refused at the 10,001st, before the rest are built."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = read_capped(stream)
        try:
            return json_object_body(raw, list_limits={"consumers": MAX_CONSUMERS})
        except TooManyItems:
            raise Problem(
                status=400,
                code="validation_failed",
                detail="Validation failed.",
                errors={
                    "consumers": [
                        f"holds more than {MAX_CONSUMERS:,} consumers; "
                        f"at most {MAX_CONSUMERS:,} per call"
                    ]
                },
            ) from None


class ConsumersView(APIView):
    parser_classes = [ConsumersBodyParser]
    permission_classes = [HasScope]
    required_scope = "ingest"

    @extend_schema(
        operation_id="drop_consumers_register",
        summary="Register consumers (up to 10,000 per call)",
        description=(
            "Clear identifiers are standardized and hashed on arrival and never stored. "
            "Idempotent: sending a consumer again changes nothing. Each bad consumer is "
            "listed in `rejected` and the others are registered."
        ),
        request=RegistrationRequestSerializer,
        responses={
            200: RegistrationResponseSerializer,
            400: OpenApiResponse(ProblemSerializer, description="validation_failed"),
            401: OpenApiResponse(ProblemSerializer, description="authentication_failed"),
            403: OpenApiResponse(ProblemSerializer, description="scope_missing"),
            413: OpenApiResponse(ProblemSerializer, description="payload_too_large"),
            503: OpenApiResponse(
                ProblemSerializer, description="registration_busy, evidence_key_refused"
            ),
        },
        examples=[
            OpenApiExample(
                "Two consumers",
                request_only=True,
                value={
                    "consumers": [
                        {
                            "remote_identifier": "C-1",
                            "email": ["anna.smith@domain.com"],
                            "ndz": [
                                {
                                    "first_name": "Anna",
                                    "last_name": "Smith",
                                    "dob": "1985-07-04",
                                    "zip": "91790",
                                }
                            ],
                        },
                        {
                            "remote_identifier": "C-2",
                            "hashes": {"phone": ["vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="]},
                        },
                    ]
                },
            )
        ],
    )
    def post(self, request: Request) -> Response:
        # A full call is a few MB: the body is read by JsonBodyParser, against its own cap
        # (json_body.MAX_BODY_BYTES), not Django's 2.5 MB.
        consumers = consumers_of_body(request.data)
        api_key = request.auth
        assert isinstance(api_key, ApiKey)  # HasScope
        assert api_key.broker is not None  # only a metrics key has none, and only that scope
        try:
            result = consumers_register(
                broker=api_key.broker,
                records=parse_api_consumers(consumers),
                actor=f"apikey:{api_key.prefix}",
                source="api",
                lock_timeout=LOCK_WAIT_SECONDS,
                api_key_prefix=api_key.prefix,
            )
        except RegistrationBusy as exc:
            raise _busy(exc) from None
        except EvidenceKeyRefused as exc:
            raise _unsigned(exc) from None
        return Response(
            {
                "accepted": result.rows_accepted,
                "rejected": [
                    {
                        "index": r.position,
                        "remote_identifier": r.remote_identifier,
                        "errors": r.errors,
                    }
                    for r in result.rejected
                ],
            }
        )


def consumers_of_body(body: Any) -> list[Any]:
    if not isinstance(body, dict):
        raise Problem(
            status=400,
            code="validation_failed",
            detail='The body must be a JSON object {"consumers": [...]}.',
            errors={"non_field_errors": ['expected {"consumers": [...]}']},
        )
    errors: dict[str, list[str]] = {
        str(key): ["unknown field; expected consumers"] for key in body if key != "consumers"
    }
    consumers = body.get("consumers")
    if consumers is None:
        errors["consumers"] = ["this field is required"]
    elif not isinstance(consumers, list):
        errors["consumers"] = ["must be a list of consumer objects"]
    elif len(consumers) > MAX_CONSUMERS:
        errors["consumers"] = [
            f"holds {len(consumers):,} consumers; at most {MAX_CONSUMERS:,} per call"
        ]
    if errors:
        raise Problem(
            status=400, code="validation_failed", detail="Validation failed.", errors=errors
        )
    assert isinstance(consumers, list)
    return consumers


class ConsumerView(APIView):
    permission_classes = [HasScope]
    required_scope = "ingest"

    @extend_schema(
        operation_id="drop_consumers_forget",
        summary="Forget a consumer",
        description="Deletes the consumer and its identifier hashes. Idempotent in effect: "
        "a consumer already forgotten (or never registered) is a 404.",
        parameters=[
            OpenApiParameter(
                "remote_identifier",
                OpenApiTypes.STR,
                OpenApiParameter.PATH,
                description="The pointer the consumer was registered with (URL-encoded).",
            )
        ],
        request=None,
        responses={
            204: OpenApiResponse(description="Forgotten."),
            401: OpenApiResponse(ProblemSerializer, description="authentication_failed"),
            403: OpenApiResponse(ProblemSerializer, description="scope_missing"),
            404: OpenApiResponse(ProblemSerializer, description="not_found"),
            503: OpenApiResponse(ProblemSerializer, description="registration_busy"),
        },
    )
    def delete(self, request: Request, remote_identifier: str) -> Response:
        api_key = request.auth
        assert isinstance(api_key, ApiKey)  # HasScope
        assert api_key.broker is not None  # only a metrics key has none, and only that scope
        if unstorable_reason(remote_identifier):
            raise _no_consumer()  # no consumer can have been registered under it
        try:
            consumer_forget(
                broker=api_key.broker,
                remote_identifier=remote_identifier,
                actor=f"apikey:{api_key.prefix}",
                lock_timeout=LOCK_WAIT_SECONDS,
            )
        except Consumer.DoesNotExist:
            raise _no_consumer() from None
        except RegistrationBusy as exc:
            raise _busy(exc) from None
        return Response(status=204)
