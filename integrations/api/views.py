"""The broker-facing API views: they parse, call one service or selector, and render."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class PingView(APIView):
    """Credential check (docs/contracts.md §3.3): 200 and an empty body for an active key."""

    @extend_schema(
        summary="Check an API key",
        responses={200: OpenApiResponse(description="The key is valid; empty body.")},
    )
    def get(self, request: Request) -> Response:
        return Response(status=200)
