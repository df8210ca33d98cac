"""``GET /api/v1/drop/outcomes``: the outcome history for auditors (scope ``audit``).

One row per deletion request of the key's broker, oldest first, as paginated JSON::

    GET /api/v1/drop/outcomes?since=2026-03-01&limit=500
    {"results": [{...}, ...], "next_cursor": "3039", "next": "https://.../outcomes?..."}

or, with ``Accept: text/csv`` or ``?format=csv``, the whole filtered history streamed as one
CSV (cells a spreadsheet would run as formulas are defused); any other ``Accept`` gets JSON.
Pages are keyset-paginated by request id, so a page never shifts while new requests arrive.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.http import HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from integrations.api.callback_serializers import ProblemSerializer
from integrations.drop.calendar import drop_day_bounds
from integrations.models import ApiKey
from integrations.selectors.outcomes import (
    OUTCOME_COLUMNS,
    deletion_outcomes,
    deletion_outcomes_csv,
)
from integrations.services.evidence.audit import outcome_export_record
from integrations.web.errors import Problem
from integrations.web.permissions import HasScope

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


class CsvRenderer(BaseRenderer):
    """Lets content negotiation pick CSV; the view streams the body itself."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        raise NotImplementedError("the outcomes view streams its CSV")


# What ``since`` and ``until`` take, exactly as the schema declares it: an RFC 3339 full-date,
# or an RFC 3339 date-time (at most microseconds, with its offset; ``T`` and ``Z`` in either
# case, as RFC 3339's section 5.6 allows). Years 1000 to 9998 keep every bound, moved to UTC
# and past a whole day, within the dates Python and PostgreSQL both hold.
_YEAR = r"(?:1[0-9]{3}|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])"
_DATE = _YEAR + r"-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
DATE_PATTERN = rf"^{_DATE}$"
DATE_TIME_PATTERN = (
    rf"^{_DATE}[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{{1,6}})?"
    r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)


def _rfc3339_date_time(text: str) -> dt.datetime | None:
    """``text`` as a date-time if it is one ``DATE_TIME_PATTERN`` takes, else None; raises
    ``ValueError`` for a day the month does not have."""
    if not re.fullmatch(DATE_TIME_PATTERN[1:-1], text):
        return None
    # Capitals: Python reads no lowercase ``z``.
    return dt.datetime.fromisoformat(text.upper())


@extend_schema_field(
    {
        "type": "string",
        "anyOf": [
            {"format": "date", "pattern": DATE_PATTERN},
            {"format": "date-time", "pattern": DATE_TIME_PATTERN},
        ],
    }
)
class MomentField(serializers.Field):
    """A date (as a bound it takes in the whole day: ``until`` runs to its end) or a
    date-time, as a UTC datetime. A date is a day of DROP's calendar, as ``outcomes export``
    and the evidence packs read it, so the same dates give the same rows."""

    default_error_messages = {
        "invalid": "Use a date (YYYY-MM-DD) or an RFC 3339 time (2026-03-01T09:30:00Z), "
        "years 1000 to 9998."
    }

    def __init__(self, *, end: bool, **kwargs: Any) -> None:
        self.end = end
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dt.datetime:
        text = data if isinstance(data, str) else ""
        try:
            if re.fullmatch(DATE_PATTERN[1:-1], text):
                start, next_day = drop_day_bounds(dt.date.fromisoformat(text))
                return (next_day if self.end else start).astimezone(dt.UTC)
            moment = _rfc3339_date_time(text)
            if moment is not None:
                # In UTC: PostgreSQL takes offsets up to 15:59 only, Python's up to 23:59.
                return moment.astimezone(dt.UTC)
        except ValueError:
            pass  # a day the month does not have
        self.fail("invalid")

    def to_representation(self, value: dt.datetime) -> str:
        return value.isoformat()


# The cursor is the last row's id in hex, at most 2**63 - 1 (PostgreSQL's bigint).
CURSOR_PATTERN = r"^[0-7]?[0-9a-f]{1,15}$"


def cursor_encode(after_id: int) -> str:
    return f"{after_id:x}"


class OutcomeQuerySerializer(serializers.Serializer):
    broker = serializers.RegexField(
        r"^[0-9]{4}\Z",
        required=False,
        help_text="The key's own broker id (a key reads only its broker's outcomes).",
    )
    since = MomentField(
        end=False,
        required=False,
        help_text="Matched at or after this date (YYYY-MM-DD, a day of DROP's calendar: "
        "California's) or RFC 3339 time.",
    )
    until = MomentField(
        end=True,
        required=False,
        help_text="Matched up to this date (inclusive; a day of DROP's calendar) or before this "
        "RFC 3339 time.",
    )
    cursor = serializers.RegexField(
        CURSOR_PATTERN[:-1] + r"\Z",
        required=False,
        error_messages={"invalid": "Not a cursor this API gave out."},
        help_text="`next_cursor` of the last page.",
    )
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_LIMIT, default=DEFAULT_LIMIT
    )

    def validate_cursor(self, value: str) -> int:
        return int(value, 16)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A misspelt filter (``sinse``) ignored would hand back the whole history as if
        # filtered. ``format`` is DRF's, choosing CSV.
        known = [*self.fields, api_settings.URL_FORMAT_OVERRIDE]
        unknown = sorted(set(self.initial_data) - set(known))
        if unknown:
            raise serializers.ValidationError(
                {name: [f"Unknown parameter; expected {', '.join(known)}."] for name in unknown}
            )
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and until <= since:
            raise serializers.ValidationError({"until": ["Must be after since."]})
        return attrs


class OutcomeSerializer(serializers.Serializer):
    """One deletion request's history (the CSV has the same columns)."""

    request_uuid = serializers.UUIDField()
    broker_id = serializers.CharField()
    drop_session_id = serializers.CharField()
    match_date = serializers.DateField()
    work_item_id = serializers.CharField()
    list_type = serializers.CharField(help_text="DROP's list: Email, Phone, NDZ, ...")
    hash_type = serializers.CharField()
    identifier_hash = serializers.CharField()
    remote_identifier = serializers.CharField()
    remote_identifier_kind = serializers.CharField()
    integration_id = serializers.UUIDField(allow_null=True)
    isi_connection_id = serializers.UUIDField(allow_null=True)
    state = serializers.CharField()
    drop_outcome = serializers.CharField(allow_null=True)
    drop_status_code = serializers.IntegerField(allow_null=True)
    error_message = serializers.CharField(allow_null=True)
    attempts = serializers.IntegerField()
    matched_at = serializers.DateTimeField()
    dispatched_at = serializers.DateTimeField(allow_null=True, help_text="First attempt.")
    acknowledged_at = serializers.DateTimeField(allow_null=True, help_text="The broker's 2xx.")
    completed_at = serializers.DateTimeField(allow_null=True)
    work_item_status_code = serializers.IntegerField(allow_null=True)
    reported_status_code = serializers.IntegerField(allow_null=True)
    reported_at = serializers.DateTimeField(allow_null=True)
    first_reported_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When DROP first took a status for the item; an amendment moves reported_at.",
    )
    report_file = serializers.CharField(allow_null=True)
    amended = serializers.BooleanField()
    late_match = serializers.BooleanField()
    round = serializers.IntegerField(
        help_text="0: the match's own request; 1, 2...: a recurring deletion round, whose "
        "outcome never changes the work item's DROP status."
    )


class OutcomePageSerializer(serializers.Serializer):
    results = OutcomeSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.URLField(allow_null=True)


_PROBLEMS = {
    400: OpenApiResponse(
        ProblemSerializer,
        description="validation_failed, errors by field; also an until not after since",
    ),
    401: OpenApiResponse(ProblemSerializer, description="authentication_failed"),
    403: OpenApiResponse(
        ProblemSerializer, description="scope_missing (audit), or broker_forbidden"
    ),
    404: OpenApiResponse(
        ProblemSerializer, description="not_found: a format other than json or csv"
    ),
}


class OutcomesView(APIView):
    """The outcome history of the key's broker."""

    permission_classes = [HasScope]
    required_scope = "audit"
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        summary="Outcome history (one row per deletion request)",
        parameters=[
            OutcomeQuerySerializer,
            OpenApiParameter(
                api_settings.URL_FORMAT_OVERRIDE,
                OpenApiTypes.STR,
                OpenApiParameter.QUERY,
                enum=["json", "csv", ""],
                description="Chooses the format, whatever the Accept header says; empty is "
                "as absent.",
            ),
            OpenApiParameter(
                "Accept",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="text/csv streams the whole filtered history as one CSV; any "
                "other media type gets JSON.",
            ),
        ],
        responses={
            (200, "application/json"): OutcomePageSerializer,
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="Header row of the columns above, then one row each."
            ),
            **_PROBLEMS,
        },
    )
    def get(self, request: Request) -> HttpResponseBase:
        # A plain dict: as a QueryDict, DRF would take an empty value for an absent one,
        # which the schema's parameters do not allow. A parameter given twice would keep
        # its last value without a word.
        twice = {
            k: ["Given more than once."] for k, v in request.query_params.lists() if len(v) > 1
        }
        if twice:
            raise serializers.ValidationError(twice)
        query = OutcomeQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        params = query.validated_data
        api_key = request.auth
        assert isinstance(api_key, ApiKey)  # HasScope let only an API key through
        assert api_key.broker is not None  # only a metrics key has none, and only that scope
        own = api_key.broker.broker_id
        if params.get("broker", own) != own:
            raise Problem(
                status=403,
                code="broker_forbidden",
                detail=f"This API key reads broker {own}'s outcomes only.",
            )
        since, until = params.get("since"), params.get("until")
        if isinstance(request.accepted_renderer, CsvRenderer):
            disposition = f'attachment; filename="outcomes-{own}.csv"'
            if request.method == "HEAD":  # what a GET would answer, neither run nor ledgered
                # Streamed, as the GET is: no Content-Length (an empty body's 0 would be false).
                head = StreamingHttpResponse(iter(()), content_type="text/csv; charset=utf-8")
                head["Content-Disposition"] = disposition
                return head
            outcome_export_record(
                actor=f"apikey:{api_key.prefix}",
                via="api",
                broker_id=own,
                filters={
                    "since": query.initial_data.get("since"),
                    "until": query.initial_data.get("until"),
                },
            )
            chunks = deletion_outcomes_csv(broker_id=own, since=since, until=until)
            response = StreamingHttpResponse(chunks, content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = disposition
            return response
        limit = params["limit"]
        page = list(
            deletion_outcomes(
                broker_id=own,
                since=since,
                until=until,
                after_id=params.get("cursor"),
                limit=limit + 1,  # one more tells whether a next page exists
            )
        )
        next_cursor = cursor_encode(page[limit - 1]["id"]) if len(page) > limit else None
        next_url = None
        if next_cursor:
            query_params = request.query_params.copy()
            query_params["cursor"] = next_cursor
            next_url = request.build_absolute_uri(f"{request.path}?{query_params.urlencode()}")
        results = [{column: row[column] for column in OUTCOME_COLUMNS} for row in page[:limit]]
        return Response({"results": results, "next_cursor": next_cursor, "next": next_url})

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        # Errors are problem details (JSON) whatever the client asked for.
        if response.status_code >= 400 and isinstance(
            getattr(request, "accepted_renderer", None), CsvRenderer
        ):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)
