"""Probes for load balancers and orchestrators, JSON both::

GET /healthz   200 while the process answers (touches no database)
GET /readyz    200 when the database answers, every migration is applied and a worker
               beat within two minutes; otherwise 503 naming what is missing
"""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

_HEARTBEAT_AGE = "SELECT EXTRACT(EPOCH FROM now() - max(last_heartbeat)) FROM procrastinate_workers"


@cache
def _known_migrations() -> frozenset[tuple[str, str]]:
    """Every migration this code ships (read from disk once per process)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return frozenset(loader.graph.nodes)


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
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
    missing = sorted(name for name, state in checks.items() if state != "ok")
    if "database" in missing:
        missing += ["migrations", "worker"]  # unknown without it
    response = JsonResponse(
        {"ready": not missing, "checks": checks, "missing": missing},
        status=503 if missing else 200,
    )
    # Probes ask every few seconds: a 503 here is an answer, not an error to log each time.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
