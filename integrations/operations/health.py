"""Probes for load balancers and orchestrators, JSON both::

GET /healthz   200 while the process answers (touches no database)
GET /readyz    200 {"ready": true} when the database answers, every migration is applied,
               DROPPORTAL_ENCRYPTION_KEYS reads the stored secrets and a worker beat within
               two minutes; otherwise 503 {"ready": false}

What is missing, and why (the database driver's error names its host, port and user), is
for the operator only: in the answer to a request with an API key of the ``metrics`` scope,
and in the log, one line when readiness changes.
"""

from __future__ import annotations

import logging
import threading
from functools import cache

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from integrations.models import ApiKeyScope
from integrations.services.keys import api_key_authenticate
from integrations.services.secrets import encryption_keys_check

log = logging.getLogger(__name__)

_HEARTBEAT_AGE = "SELECT EXTRACT(EPOCH FROM now() - max(last_heartbeat)) FROM procrastinate_workers"
_UNKNOWN_WITHOUT_DATABASE = ["encryption_keys", "migrations", "worker"]


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


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _checks() -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
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


def _for_the_operator(request: HttpRequest) -> bool:
    """Whether the request carries an active API key of the ``metrics`` scope. Anything
    else (no key, another key, no database to look it up in) gets the short answer."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return False
    try:
        api_key = api_key_authenticate(key.strip())
    except DatabaseError:
        return False
    return api_key is not None and ApiKeyScope.METRICS in api_key.scopes


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    checks = _checks()
    missing = sorted(name for name, state in checks.items() if state != "ok")
    if "database" in missing:
        missing += _UNKNOWN_WITHOUT_DATABASE
    elif "migrations" in missing:
        missing += ["encryption_keys"]
    missing.sort()
    readiness.seen(checks, missing)
    body: dict[str, object] = {"ready": not missing}
    if _for_the_operator(request):
        body |= {"checks": checks, "missing": missing}
    response = JsonResponse(body, status=503 if missing else 200)
    # Probes ask every few seconds: a 503 here is an answer, not an error to log each time.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
