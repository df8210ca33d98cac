"""Probes for load balancers and orchestrators, JSON both::

GET /healthz   200 while the process answers (touches no database)
GET /readyz    200 {"ready": true} when the database answers and takes writes (not a standby in
               recovery, not read-only), every migration is applied,
               DROPPORTAL_ENCRYPTION_KEYS reads the stored secrets and a worker beat within
               two minutes; otherwise 503 {"ready": false}

What is missing, and why (the database driver's error names its host, port and user), is
for the operator only: in the answer to a request with the operator's ``metrics`` key (one
of every broker: a broker's own key gets the short answer), and in the log, one line when
readiness changes. A request whose key is unknown, revoked or malformed costs its address a
token of the refused callbacks' throttle (``DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT``), and
an address out of tokens that sends a key is answered 429 before the key is looked up: the
details are no free oracle for guessing keys. A probe without a key is never throttled.
"""

from __future__ import annotations

import logging
import threading
from functools import cache
from typing import cast

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from rest_framework.request import Request

from integrations.models import ApiKeyScope
from integrations.services.staff.keys import api_key_authenticate
from integrations.services.staff.secrets import encryption_keys_check
from integrations.web.errors import problem_response
from integrations.web.permissions import bearer_key
from integrations.web.throttling import UnauthenticatedAddressThrottle

log = logging.getLogger(__name__)

_HEARTBEAT_AGE = "SELECT EXTRACT(EPOCH FROM now() - max(last_heartbeat)) FROM procrastinate_workers"
# A standby in recovery, or a database made read-only, answers reads (the migrations, the
# heartbeats replicated from the primary) while every write fails: not ready.
_WRITABLE = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'"
_CHECKS = ["database", "encryption_keys", "migrations", "worker"]


@cache
def _known_migrations() -> frozenset[tuple[str, str]]:
    """Every migration this code ships (read from disk once per process)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return frozenset(loader.graph.nodes)


class _Readiness:
    """This process's last readiness, so the log gets one line per change, not per probe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._missing: tuple[str, ...] = ()

    def seen(self, checks: dict[str, str], missing: list[str]) -> None:
        with self._lock:
            changed, self._missing = tuple(missing) != self._missing, tuple(missing)
        if not changed:
            return
        if missing:
            reasons = "; ".join(f"{name}: {checks[name]}" for name in missing if name in checks)
            log.warning("not ready (%s): %s", ", ".join(missing), reasons)
        else:
            log.info("ready")


readiness = _Readiness()


# Probes read (GET, HEAD); anything else is a 405 naming them, not an answer nor the CSRF
# check's page (which would come first: a probe has no form to protect).
@csrf_exempt
@require_safe
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _checks() -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute(_WRITABLE)
            in_recovery, read_only = cursor.fetchone()
        checks["database"] = (
            "read-only: the server is in recovery (a standby)"
            if in_recovery
            else "read-only: its transactions are read-only"
            if read_only
            else "ok"
        )
        applied = set(MigrationRecorder(connection).applied_migrations())
        unapplied = sorted(f"{app}.{name}" for app, name in _known_migrations() - applied)
        checks["migrations"] = (
            "ok" if not unapplied else f"{len(unapplied)} not applied: {', '.join(unapplied)}"
        )
        if not unapplied:  # the canary's table comes with a migration
            checks["encryption_keys"] = encryption_keys_check() or "ok"
        with connection.cursor() as cursor:
            cursor.execute(_HEARTBEAT_AGE)
            (age,) = cursor.fetchone() or (None,)
        limit = settings.DROPPORTAL_WORKER_HEARTBEAT_SECONDS
        checks["worker"] = (
            "ok"
            if age is not None and age <= limit
            else f"no worker heartbeat within {limit} s: start `manage.py worker`"
        )
    except DatabaseError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        checks["database"] = f"unreachable: {reason}"
    return checks


def _for_the_operator(request: HttpRequest, throttle: UnauthenticatedAddressThrottle) -> bool:
    """Whether the request carries the operator's key: active, of the ``metrics`` scope and
    of every broker (no broker of its own). Anything else (no key, a broker's key, another
    scope, no database to look it up in) gets the short answer; a key that is malformed,
    unknown or revoked also costs the address a token."""
    header = request.headers.get("Authorization", "")
    if not header:
        return False
    # The throttle reads only the client's address, which a plain request has too.
    drf_request = cast(Request, request)
    key = bearer_key(header)
    if key is None:
        throttle.take(drf_request, None)
        return False
    try:
        api_key = api_key_authenticate(key)
    except DatabaseError:
        return False
    if api_key is None:
        throttle.take(drf_request, None)
        return False
    return api_key.broker is None and ApiKeyScope.METRICS in api_key.scopes


def _throttled(throttle: UnauthenticatedAddressThrottle) -> HttpResponse:
    response = problem_response(
        status=429,
        code="rate_limited",
        detail="Too many refused API keys from this address; try again later.",
    )
    response["Retry-After"] = str(max(1, round((throttle.wait() or 0.0) + 0.5)))
    return response


@csrf_exempt
@require_safe
@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    throttle = UnauthenticatedAddressThrottle()
    # Asking costs nothing; only a request with a key is refused when out of tokens, so a
    # load balancer's probe (no key) always gets its answer.
    if request.headers.get("Authorization") and not throttle.allow_request(
        cast(Request, request), None
    ):
        return _throttled(throttle)
    checks = _checks()
    # A check not made (no database, migrations missing) is missing too: unknown.
    missing = sorted(name for name in _CHECKS if checks.get(name, "unknown") != "ok")
    readiness.seen(checks, missing)
    body: dict[str, object] = {"ready": not missing}
    if _for_the_operator(request, throttle):
        body |= {"checks": checks, "missing": missing}
    response = JsonResponse(body, status=503 if missing else 200)
    # Probes ask every few seconds: a 503 here is an answer, not an error to log each time.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
