"""The suppression check for brokers' pipelines (scope ``suppression``; docs/contracts.md).

    POST /api/v1/drop/suppression/check
    {"consumers": [{"email": ["anna@example.com"]}, {"hashes": {"phone": ["<Base64>"]}}]}
    200 {"results": [{"index": 0, "suppressed": true, "list_types": ["email"]},
                     {"index": 1, "suppressed": false, "list_types": []}]}

Before it collects, a pipeline asks whether the people it is about to take in are on the
broker's suppression list: a hash DROP sent and did not remove. Each element is shaped like
a registration's consumer without its pointer (clear identifiers or ``hashes``), up to
10,000 a call; clear values are standardized and hashed on arrival as a registration's are.
Nothing is stored; one ledger event counts the call. An element that cannot be read is
answered in place with ``suppressed`` null and its errors (the others are answered); a
malformed body, or more than 10,000 elements, is a 400 ``validation_failed``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from integrations.api.callback_serializers import ProblemSerializer
from integrations.api.consumers import (
    MAX_CONSUMERS,
    ConsumersBodyParser,
    HashesSerializer,
    NameVinSerializer,
    NdzSerializer,
    consumers_of_body,
)
from integrations.api.schema import JSON_VALUE_REF
from integrations.consumers.api_reader import parse_api_identifiers
from integrations.list_types import HASH_TYPES
from integrations.models import ApiKey
from integrations.services.cycle.suppression import suppression_check
from integrations.web.permissions import HasScope

# --- Schema ----------------------------------------------------------------------------


class CheckedConsumerSerializer(serializers.Serializer):
    """A registration's consumer without its pointer: clear identifiers or ``hashes``."""

    email = serializers.ListField(child=serializers.CharField(), required=False)
    phone = serializers.ListField(child=serializers.CharField(), required=False)
    ndz = NdzSerializer(many=True, required=False)
    name_vin = NameVinSerializer(many=True, required=False)
    maid = serializers.ListField(child=serializers.CharField(), required=False)
    ctvid = serializers.ListField(child=serializers.CharField(), required=False)
    hashes = HashesSerializer(required=False)


class CheckedConsumerField(serializers.JSONField):
    """One element of ``consumers``: any JSON value. An object as ``CheckedConsumer``
    describes it is checked; anything else is answered with its errors, in place."""


class CheckedConsumerFieldExtension(OpenApiSerializerFieldExtension):
    target_class = CheckedConsumerField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        checked = auto_schema.resolve_serializer(CheckedConsumerSerializer, direction).ref
        return {
            "description": "A consumer's identifiers; any other value is answered with its "
            "`errors` and `suppressed` null (200).",
            "anyOf": [checked, JSON_VALUE_REF],
        }


class SuppressionCheckRequestSerializer(serializers.Serializer):
    consumers = serializers.ListField(child=CheckedConsumerField(), max_length=MAX_CONSUMERS)


class SuppressionCheckRequestExtension(OpenApiSerializerExtension):
    target_class = SuppressionCheckRequestSerializer

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_basic_serializer(self.target, direction)
        return {**schema, "additionalProperties": False}  # another key is a 400


class SuppressionResultSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="Position in the request's consumers array.")
    suppressed = serializers.BooleanField(
        allow_null=True,
        help_text="Whether a hash of the entry is on the suppression list; null when the "
        "entry could not be read (see errors): do not collect it as cleared.",
    )
    list_types = serializers.ListField(
        child=serializers.ChoiceField(choices=HASH_TYPES),
        help_text="The list types of the entry's suppressed hashes.",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # Declared here: as a class attribute it would shadow Serializer.errors.
        fields["errors"] = serializers.DictField(
            child=serializers.ListField(child=serializers.CharField()),
            required=False,
            help_text="Only for an entry that could not be read: messages by path of the "
            "bad value (email[1], ndz[0].dob, hashes.phone[0]).",
        )
        return fields


class SuppressionCheckResponseSerializer(serializers.Serializer):
    results = SuppressionResultSerializer(many=True)


# --- View ------------------------------------------------------------------------------


class SuppressionCheckView(APIView):
    parser_classes = [ConsumersBodyParser]
    permission_classes = [HasScope]
    required_scope = "suppression"

    @extend_schema(
        operation_id="drop_suppression_check",
        summary="Check identifiers against the suppression list (up to 10,000 per call)",
        description=(
            "Before collecting, ask whether consumers are on the broker's suppression list: "
            "a hash DROP sent and did not remove. Clear identifiers are standardized and "
            "hashed on arrival as a registration's are; nothing is stored. Answers come in "
            "the request's order."
        ),
        request=SuppressionCheckRequestSerializer,
        responses={
            200: SuppressionCheckResponseSerializer,
            400: OpenApiResponse(ProblemSerializer, description="validation_failed"),
            401: OpenApiResponse(ProblemSerializer, description="authentication_failed"),
            403: OpenApiResponse(ProblemSerializer, description="scope_missing"),
            413: OpenApiResponse(ProblemSerializer, description="payload_too_large"),
        },
        examples=[
            OpenApiExample(
                "A clear email and a hashed phone",
                request_only=True,
                value={
                    "consumers": [
                        {"email": ["anna.smith@domain.com"]},
                        {"hashes": {"phone": ["vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="]}},
                    ]
                },
            ),
            OpenApiExample(
                "The answer",
                response_only=True,
                value={
                    "results": [
                        {"index": 0, "suppressed": True, "list_types": ["email"]},
                        {"index": 1, "suppressed": False, "list_types": []},
                    ]
                },
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        consumers = consumers_of_body(request.data)
        api_key = request.auth
        assert isinstance(api_key, ApiKey)  # HasScope
        assert api_key.broker is not None  # only a metrics key has none, and only that scope
        answers = suppression_check(
            broker=api_key.broker,
            entries=parse_api_identifiers(consumers),
            actor=f"apikey:{api_key.prefix}",
        )
        return Response(
            {
                "results": [
                    {
                        "index": answer.index,
                        "suppressed": answer.suppressed,
                        "list_types": list(answer.list_types),
                        **({"errors": answer.errors} if answer.errors else {}),
                    }
                    for answer in answers
                ]
            }
        )
