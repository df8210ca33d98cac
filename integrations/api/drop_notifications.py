"""``POST /api/v1/drop/notifications/{broker_id}``: DROP's own notifications (its webhook).

No API key: DROP signs each notification with the secret its portal shows the broker
(``brokers drop-webhook-secret``), ``X-Webhook-Signature: sha256=<hex HMAC-SHA256 of
"<X-Webhook-Timestamp>.<raw body>">``. Every notification read costs the sender's address a
token of ``DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT``, accepted or refused; an address
without one gets 429 before anything is read. Answers, each counted in
``dropportal_drop_notifications``:

- 204: recorded (``services.cycle.drop_notifications``), even without an event id or type; or a
  duplicate, nothing done: an event id already seen, or a signature already used (a captured
  notification sent again, whatever event id and type headers it now carries);
- 401 ``signature_invalid`` / ``timestamp_out_of_range`` (more than 5 minutes off): not in the
  ledger, since anyone can send those;
- 413 over 64 KiB; 429 ``rate_limited``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from integrations.api.callback_auth import CALLBACK_BODY_LIMIT
from integrations.api.callback_serializers import ProblemSerializer
from integrations.counters import DROP_NOTIFICATIONS
from integrations.drop import notifications
from integrations.drop.notifications import NotificationRejected
from integrations.services.cycle.drop_notifications import drop_notification_receive
from integrations.web.errors import Problem
from integrations.web.throttling import AddressThrottled, UnauthenticatedAddressThrottle


class DropNotificationBodySerializer(serializers.Serializer):
    """What DROP sends: a message for people; the event type header says what happened."""

    message = serializers.CharField(required=False)


def _header(name: str, description: str, *, required: bool = True) -> OpenApiParameter:
    return OpenApiParameter(
        name, OpenApiTypes.STR, OpenApiParameter.HEADER, required=required, description=description
    )


class DropNotificationView(APIView):
    """DROP tells the broker something happened; answered 204 once checked and recorded."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []

    @extend_schema(
        summary="Receive a notification from DROP",
        description="DROP's webhook (API 1.2.0). Signed with the broker's DROP webhook "
        "secret; deduplicated on X-Webhook-Event-Id and on the signature (a notification "
        "taken once is not taken again). download.ready queues the broker's "
        "pull at once; upload.* and amendment.* are recorded on the file they are about "
        "(one that comes while a file of that kind is being sent: once DROP's answer to it "
        "is recorded).",
        auth=[],
        parameters=[
            OpenApiParameter(
                "broker_id",
                OpenApiTypes.STR,
                OpenApiParameter.PATH,
                description="The broker's 4-digit DROP id.",
            ),
            _header(notifications.EVENT_ID_HEADER, "One logical event (deduplicated on it)."),
            _header(notifications.EVENT_TYPE_HEADER, "download.ready, upload.received, ..."),
            _header(notifications.DELIVERY_ID_HEADER, "One per attempt.", required=False),
            _header(notifications.TIMESTAMP_HEADER, "UTC ISO 8601, 7 fractional digits."),
            _header(notifications.VERSION_HEADER, "1.0", required=False),
            _header(notifications.SIGNATURE_HEADER, "sha256=<lowercase hex HMAC-SHA256>"),
        ],
        request=DropNotificationBodySerializer,
        responses={
            204: OpenApiResponse(description="Recorded, or an event already recorded."),
            401: OpenApiResponse(
                ProblemSerializer, description="signature_invalid or timestamp_out_of_range"
            ),
            413: OpenApiResponse(ProblemSerializer, description="payload_too_large"),
            429: OpenApiResponse(ProblemSerializer, description="rate_limited; see Retry-After"),
        },
    )
    def post(self, request: Request, broker_id: str) -> Response:
        throttle = UnauthenticatedAddressThrottle()
        if not throttle.allow_request(request, self):
            raise AddressThrottled(
                wait=throttle.wait() or 0.0,
                detail="Too many notifications from this address; try again later.",
            )
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > CALLBACK_BODY_LIMIT or len(request.body) > CALLBACK_BODY_LIMIT:
            raise Problem(
                status=413, code="payload_too_large", detail="Notifications are limited to 64 KiB."
            )
        headers = request.headers
        # Accepted notifications cost a token too: a valid one cannot be sent without limit.
        throttle.take(request, self)
        try:
            received = drop_notification_receive(
                broker_id=broker_id,
                event_id=headers.get(notifications.EVENT_ID_HEADER, ""),
                event_type=headers.get(notifications.EVENT_TYPE_HEADER, ""),
                delivery_id=headers.get(notifications.DELIVERY_ID_HEADER, ""),
                timestamp=headers.get(notifications.TIMESTAMP_HEADER),
                signature=headers.get(notifications.SIGNATURE_HEADER),
                body=request.body,
            )
        except NotificationRejected as exc:
            raise Problem(status=401, code=exc.code, detail=str(exc)) from None
        DROP_NOTIFICATIONS.labels(result="duplicate" if received.duplicate else "recorded").inc()
        return Response(status=204)

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        if isinstance(exc, exceptions.APIException):
            code = exc.problem_code if isinstance(exc, Problem) else "error"
            DROP_NOTIFICATIONS.labels(result=code).inc()
            # Counted instead of a log line each: anyone can send these.
            response._has_been_logged = True  # type: ignore[attr-defined]
        return response
