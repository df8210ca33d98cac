"""A request body sent in chunks, with no ``Content-Length``, is refused with a clear problem.

Django reads a body by its ``Content-Length``, and gunicorn hands a chunked body on without
one: it would read as empty and be refused as "not valid JSON" (or a field missing) whatever
was sent, on every retry. DRF does not even call a parser for it. The sender is told what to
change instead, before any view reads the body.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from integrations.web.errors import is_api_request, problem_response

UNSIZED = (
    "The body was sent in chunks (Transfer-Encoding: chunked) without a Content-Length "
    "header; this service reads a body by its length: send it with Content-Length."
)


class UnsizedBodyRefusedMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        if (
            is_api_request(request)
            and "chunked" in str(meta.get("HTTP_TRANSFER_ENCODING", "")).lower()
            and not meta.get("CONTENT_LENGTH")
        ):
            return problem_response(
                status=400,
                code="validation_failed",
                detail=UNSIZED,
                errors={"non_field_errors": [UNSIZED]},
            )
        return self.get_response(request)
