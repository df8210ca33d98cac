"""URLs of ``bench_callbacks.py``'s server: the product's, and the bare view to compare with.

``PUT /bench/bare-callback`` does only the minimum durable work of recording a callback:
parse the JSON, one UPDATE and one INSERT in a transaction, in SQL. No authentication, no
signature, no validation, no ledger hashing, no work item settlement.
``PUT /bench/bare-orm-callback`` does the same through the ORM.
"""

from __future__ import annotations

import json

from django.db import connection, transaction
from django.db.models.functions import Now
from django.urls import include, path
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from integrations.models import DeletionRequest, LedgerEvent


class BareCallbackView(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes: list[type] = []

    def put(self, request: Request) -> Response:
        payload = json.loads(request.body)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE integrations_deletionrequest SET state = 'completed',"
                " drop_outcome = %s, drop_status_code = 3, completed_at = now()"
                " WHERE request_uuid = %s",
                [payload["drop_outcome"], payload["request_uuid"]],
            )
            cursor.execute(
                "INSERT INTO integrations_ledgerevent"
                " (created_at, broker_id, kind, subject, actor, data, event_hash)"
                " VALUES (now(), '4821', 'bench.bare', %s, 'bench', '{}', '')",
                [payload["request_uuid"]],
            )
        return Response({"status": "recorded"})


class BareOrmCallbackView(BareCallbackView):
    """The same minimum, written with the ORM as a Django view usually is (for information)."""

    def put(self, request: Request) -> Response:
        payload = json.loads(request.body)
        with transaction.atomic():
            DeletionRequest.objects.filter(request_uuid=payload["request_uuid"]).update(
                state="completed",
                drop_outcome=payload["drop_outcome"],
                drop_status_code=3,
                completed_at=Now(),
            )
            LedgerEvent.objects.create(
                created_at=timezone.now(),
                broker_id="4821",
                kind="bench.bare",
                subject=payload["request_uuid"],
                actor="bench",
                event_hash="",
            )
        return Response({"status": "recorded"})


urlpatterns = [
    path("bench/bare-callback", BareCallbackView.as_view()),
    path("bench/bare-orm-callback", BareOrmCallbackView.as_view()),
    path("", include("dropportal.urls")),
]
