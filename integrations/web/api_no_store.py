"""The API's answers are not stored by any cache: outcome histories (pointers, hashes),
suppression checks and credential checks are a broker's own data, and a shared cache is
kept out only by the ``Authorization`` header (RFC 9111 3.5), a browser's or a client
library's private cache not at all. An answer that says otherwise keeps its own word."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils.cache import patch_cache_control

from integrations.web.errors import is_api_request


class ApiAnswersNotStoredMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if is_api_request(request) and not response.has_header("Cache-Control"):
            patch_cache_control(response, no_store=True)
        return response
