"""PostgreSQL unreachable: every request answers 503 (problem+json under /api/, a short page
elsewhere) with ``Retry-After`` instead of a 500 with a traceback, and the process logs one
WARNING line per outage. Nothing restarts: the first connection that opens again ends it::

    MIDDLEWARE = ["integrations.operations.outage.DatabaseOutageMiddleware", ...]
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.contrib.sessions.middleware import SessionMiddleware
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.db.backends.signals import connection_created
from django.http import HttpRequest, HttpResponse
from psycopg.errors import QueryCanceled

from integrations.web.errors import problem_response

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 30

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dropportal: temporarily unavailable</title>
</head><body><h1>Temporarily unavailable</h1>
<p>dropportal {why}. Nothing you sent was lost; try again in a minute.</p>
</body></html>
"""


class _Outage:
    """Whether this process is in an outage: logged once when it starts, once when it ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ongoing = False

    def started(self, exc: BaseException) -> None:
        with self._lock:
            if self.ongoing:
                return
            self.ongoing = True
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("PostgreSQL is unreachable, answering 503 until it is back: %s", reason)

    def ended(self, **kwargs: Any) -> None:
        with self._lock:
            if not self.ongoing:
                return
            self.ongoing = False
        log.info("PostgreSQL is reachable again")


outage = _Outage()
connection_created.connect(outage.ended, dispatch_uid="dropportal-outage-ended")


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached (not a query's own error, such as
    a statement timeout, which leaves the connection usable)."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    if connection.connection is None:
        return True  # the connection could not be opened
    try:
        return not connection.is_usable()
    except DatabaseError:
        return True


def statement_cut_short(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement the server cancelled at the web's statement timeout
    (``dropportal.wsgi`` sets it): the database answers, but not in time for this request."""
    return isinstance(exc, OperationalError) and isinstance(exc.__cause__, QueryCanceled)


_UNREACHABLE = "The database is unreachable; retry after the time in Retry-After."
# A statement past the web's timeout (a lock held by a long batch, say): the database
# answers, so saying it is unreachable would send operators looking for the wrong fault.
_NOT_IN_TIME = "The database did not answer in time; retry after the time in Retry-After."


def outage_response(request: HttpRequest, *, cut_short: bool = False) -> HttpResponse:
    response: HttpResponse
    if request.path.startswith(("/api/", "/metrics")):
        response = problem_response(
            status=503,
            code="database_unavailable",
            detail=_NOT_IN_TIME if cut_short else _UNREACHABLE,
        )
    else:
        why = (
            "did not get its database's answer in time"
            if cut_short
            else ("cannot reach its database")
        )
        response = HttpResponse(_PAGE.format(why=why), status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    # The outage is logged once (above), not once per request by django.request.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class DatabaseOutageMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if statement_cut_short(exception):
            log.warning(
                "%s %s: a query ran past the web's statement timeout, answered 503",
                request.method,
                request.path,
            )
            return outage_response(request, cut_short=True)
        if not database_unreachable(exception):
            return None
        outage.started(exception)
        return outage_response(request)


class OutageTolerantSessionMiddleware(SessionMiddleware):
    """Django's session middleware, keeping the view's answer when the session cannot be saved.

    Staff sessions are saved on every request (their idle expiry), so an admin request in an
    outage reaches the database once more after its view, where ``process_exception`` no
    longer applies and Django would turn any answer into a 500 with a traceback.
    """

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        try:
            return super().process_response(request, response)
        except DatabaseError as exc:
            if not database_unreachable(exc):
                raise
            outage.started(exc)
            # The view has answered (a view that met the outage answered 503 already): only
            # the session's idle clock is not moved on.
            return response
