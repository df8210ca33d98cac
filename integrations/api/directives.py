"""A service provider acknowledges a directive with its own key (scope ``directive_ack``).

    POST /api/v1/drop/directives/17/acknowledgement   {"reference": "ticket 4410"}
    200 {"id": 17, "acknowledged_at": "...", "acknowledged_by": "apikey:dpk_…", ...}

The key is bound to one provider: it acknowledges that provider's directives only (another
provider's of the same broker: 403 ``directive_of_another_provider``; another broker's, or
none: 404 ``not_found``). Acknowledging again changes nothing and answers what was recorded.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from integrations.api.callback_serializers import ProblemSerializer
from integrations.models import ApiKey, ApiKeyScope, Directive
from integrations.services.providers.directives import REFERENCE_MAX, directive_acknowledge
from integrations.validators import has_control_characters
from integrations.web.errors import Problem
from integrations.web.permissions import HasScope
from integrations.wire_fields import StrictCharField


class AcknowledgementRequestSerializer(serializers.Serializer):
    reference = StrictCharField(  # a JSON string: a number is not taken as its digits
        trim_whitespace=True,
        max_length=REFERENCE_MAX,
        help_text="The provider's own reference for the deletion (a ticket, a job id); "
        "no control characters.",
    )

    def validate_reference(self, value: str) -> str:
        # Staff read it in the admin and in a terminal, where ESC sequences are commands.
        if has_control_characters(value):
            raise serializers.ValidationError("Control characters are not allowed.")
        return value


class AcknowledgementSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The directive's id.")
    sha256 = serializers.CharField(help_text="SHA-256 of the directive's CSV.")
    acknowledged_at = serializers.DateTimeField()
    acknowledged_by = serializers.CharField(help_text="Who recorded it: the key's prefix.")
    reference = serializers.CharField()


class DirectiveAcknowledgementView(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKeyScope.DIRECTIVE_ACK

    @extend_schema(
        operation_id="drop_directive_acknowledge",
        summary="Acknowledge a directive",
        description="A service provider or contractor says it deleted the consumers a "
        "directive lists, with its own reference. The key must be that provider's "
        "(scope directive_ack). A second acknowledgement changes nothing and answers the "
        "first.",
        request=AcknowledgementRequestSerializer,
        responses={
            200: AcknowledgementSerializer,
            400: OpenApiResponse(ProblemSerializer, description="validation_failed"),
            401: OpenApiResponse(ProblemSerializer, description="authentication_failed"),
            403: OpenApiResponse(
                ProblemSerializer,
                description="scope_missing, or directive_of_another_provider",
            ),
            404: OpenApiResponse(ProblemSerializer, description="not_found"),
        },
    )
    def post(self, request: Request, directive_id: int) -> Response:
        api_key = request.auth
        assert isinstance(api_key, ApiKey)  # HasScope
        assert api_key.broker is not None  # only a metrics key has none, and only that scope
        body = AcknowledgementRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        directive = Directive.objects.filter(pk=directive_id, broker=api_key.broker).first()
        if directive is None:
            # Also another broker's: existence does not leak.
            raise Problem(status=404, code="not_found", detail="No such directive.")
        if directive.provider_id != api_key.provider_id:
            raise Problem(
                status=403,
                code="directive_of_another_provider",
                detail="This API key acknowledges its own provider's directives only.",
            )
        done = directive_acknowledge(
            directive=directive,
            reference=body.validated_data["reference"],
            actor=f"apikey:{api_key.prefix}",
        )
        return Response(
            {
                "id": done.pk,
                "sha256": done.sha256,
                "acknowledged_at": done.acknowledged_at,
                "acknowledged_by": done.acknowledged_by,
                "reference": done.acknowledgement_reference,
            }
        )
