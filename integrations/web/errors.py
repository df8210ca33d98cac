"""RFC 9457 problem details for every error under /api/.

Each problem carries a stable ``code`` (docs/contracts.md §5.2); validation problems add
``errors`` keyed by field. Raise ``Problem`` from a view for an error with its own code::

    raise Problem(status=409, code="outcome_conflict", detail="...")
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "urn:dropportal:problem:"


class Problem(exceptions.APIException):
    """An API error with an explicit status, stable code and optional field errors."""

    def __init__(
        self,
        *,
        status: int,
        code: str,
        detail: str,
        errors: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = status
        self.problem_code = code
        self.errors = errors
        self.headers = headers or {}


def problem_body(
    *, status: int, code: str, detail: str, errors: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if errors is not None:
        body["errors"] = errors
    return body


def _code_for(exc: exceptions.APIException) -> str:
    if isinstance(exc, Problem):
        return exc.problem_code
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        return "authentication_failed"
    if isinstance(exc, exceptions.PermissionDenied):
        return "permission_denied"
    if isinstance(exc, exceptions.ValidationError | exceptions.ParseError):
        return "validation_failed"
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return "unsupported_media_type"
    if isinstance(exc, exceptions.Throttled):
        return "rate_limited"
    return {
        status.HTTP_404_NOT_FOUND: "not_found",
        status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
        status.HTTP_406_NOT_ACCEPTABLE: "not_acceptable",
        status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "payload_too_large",
    }.get(exc.status_code, "error")


def _detail_text(detail: Any) -> str:
    if isinstance(detail, list) and detail:
        return _detail_text(detail[0])
    if isinstance(detail, dict):
        return "The request has invalid fields."
    return str(detail)


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: turn every API exception into problem details."""
    from rest_framework.views import exception_handler  # not at import: DRF imports us

    # Django's own 404 and 403 (an unknown ?format=, get_object_or_404) as DRF's, which
    # DRF's handler would answer in its own shape.
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or None)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response  # an unexpected error: Django's 500 handler answers (also as a problem)
    code = _code_for(exc)
    errors: dict[str, Any] | None = None
    if isinstance(exc, Problem):
        errors = exc.errors
        for name, value in exc.headers.items():
            response[name] = value
    elif isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
    detail = "Validation failed." if errors and not isinstance(exc, Problem) else None
    response.data = problem_body(
        status=response.status_code,
        code=code,
        detail=detail or _detail_text(exc.detail),
        errors=errors,
    )
    response.content_type = PROBLEM_CONTENT_TYPE
    request = context.get("request")
    if request is not None:
        # JSON whatever the view renders otherwise (the schema's YAML, when ``?format=``
        # names no renderer): DRF renders the answer with the request's renderer.
        from rest_framework.renderers import JSONRenderer  # not at import, as above

        request.accepted_renderer = JSONRenderer()
        request.accepted_media_type = PROBLEM_CONTENT_TYPE
    return response


def problem_response(
    *, status: int, code: str, detail: str, errors: dict[str, Any] | None = None
) -> HttpResponse:
    """A problem outside DRF (Django's 404/500 handlers, middleware)."""
    return JsonResponse(
        problem_body(status=status, code=code, detail=detail, errors=errors),
        status=status,
        content_type=PROBLEM_CONTENT_TYPE,
        json_dumps_params={"ensure_ascii": False},
    )


def is_api_request(request: HttpRequest) -> bool:
    """Whether ``request`` is the API's (answered with problem details), not a page's."""
    return request.path.startswith("/api/")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's own 400s (a body over DATA_UPLOAD_MAX_MEMORY_SIZE, a disallowed host...)."""
    if is_api_request(request):
        return problem_response(
            status=400, code="bad_request", detail=str(exception or "") or "Bad request."
        )
    from django.views.defaults import bad_request as html_bad_request

    return html_bad_request(request, exception)  # type: ignore[arg-type]


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_request(request):
        return problem_response(
            status=404, code="not_found", detail=f"No API endpoint at {request.path}."
        )
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)  # type: ignore[arg-type]


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api_request(request):
        return problem_response(
            status=500, code="internal_error", detail="The server failed; it has been logged."
        )
    from django.views.defaults import server_error as html_server_error

    return html_server_error(request)
