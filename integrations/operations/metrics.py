"""Prometheus metrics at ``GET /metrics`` (an API key with the ``metrics`` scope).

A broker's key sees its own broker's series only (the gauges labelled with it). A key of
every broker (no broker: the operator's own Prometheus, created by a superuser) sees every
series: the process counters, the job queues, the ledger and every broker's gauges.

Two kinds: counters kept by the processes that see the events (callbacks answered by the web
processes, delivery attempts made by the workers), and gauges read from PostgreSQL at each
scrape (jobs, open work items, days left, ledger events), which every host agrees on.
Counters count in each process; under gunicorn (``PROMETHEUS_MULTIPROC_DIR`` set, as
``manage.py serve`` does) the processes of one host share them through that directory::

    from integrations.counters import DELIVERIES
    DELIVERIES.labels(kind="webhook", result="success").inc()
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from drf_spectacular.utils import extend_schema
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from rest_framework.request import Request
from rest_framework.views import APIView

from integrations.counters import CALLBACKS
from integrations.drop.calendar import drop_today
from integrations.models import ApiKey, ApiKeyScope, Broker, CycleState, DropCycle, WorkItem
from integrations.selectors.deadlines import cycle_deadlines
from integrations.selectors.stuck import stuck_work_items
from integrations.web.permissions import HasScope

_CALLBACK_PREFIX = "/api/v1/drop/callbacks/"

# Statuses of jobs that are waiting, running or need a look; succeeded ones are history.
_JOBS = """
SELECT queue_name, status::text, count(*) FROM procrastinate_jobs
WHERE status IN ('todo', 'doing', 'failed') GROUP BY 1, 2
"""


def _jobs() -> Metric:
    family = GaugeMetricFamily(
        "dropportal_jobs", "Jobs waiting, running or failed, by queue.", labels=["queue", "status"]
    )
    with connection.cursor() as cursor:
        cursor.execute(_JOBS)
        for queue, status, n in cursor.fetchall():
            family.add_metric([queue, status], n)
    return family


def _work_items_open(broker: Broker | None) -> Metric:
    family = GaugeMetricFamily(
        "dropportal_work_items_open",
        "Work items of open cycles that DROP has no status for yet.",
        labels=["broker"],
    )
    open_cycles = DropCycle.objects.filter(state=CycleState.OPEN).may_have_outstanding()
    items = WorkItem.objects.owed().filter(cycle__in=open_cycles)
    if broker is not None:
        items = items.filter(cycle__broker=broker)
    rows = (
        items.values("cycle__broker__broker_id")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("cycle__broker__broker_id", "n")
    )
    for broker_id, n in rows:
        family.add_metric([broker_id], n)
    return family


def _cycle_days_left(broker: Broker | None) -> Metric:
    family = GaugeMetricFamily(
        "dropportal_cycle_days_left",
        "Days until the most urgent cycle still owing statuses is due (negative: overdue).",
        labels=["broker"],
    )
    nearest: dict[str, int] = {}
    broker_id = broker.broker_id if broker else None
    for deadline in cycle_deadlines(broker_id=broker_id, today=drop_today()):
        broker_id = deadline.cycle.broker.broker_id
        nearest[broker_id] = min(deadline.days_left, nearest.get(broker_id, deadline.days_left))
    for broker_id, days in sorted(nearest.items()):
        family.add_metric([broker_id], days)
    return family


def _stuck_work_items(broker: Broker | None) -> Metric:
    family = GaugeMetricFamily(
        "dropportal_stuck_work_items",
        "Open work items no automatic path brings to a status (drop doctor), by reason.",
        labels=["broker", "reason"],
    )
    for group in stuck_work_items(broker=broker):
        family.add_metric([group.broker_id, str(group.reason)], group.work_items)
    return family


def _ledger_events() -> Metric:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM integrations_ledgerevent")
        (n,) = cursor.fetchone() or (0,)
    return CounterMetricFamily("dropportal_ledger_events", "Ledger events written.", value=n)


# Gauges read from the database at each scrape; a new one is a function returning its family.
# Of every broker only: the service's own state, for the operator's key.
DATABASE_METRICS: list[Callable[[], Metric]] = [
    _jobs,
    _ledger_events,
]
# Labelled by broker: read for the key's broker only (every broker for the operator's key).
BROKER_METRICS: list[Callable[[Broker | None], Metric]] = [
    _work_items_open,
    _cycle_days_left,
    _stuck_work_items,
]


class _DatabaseCollector:
    def __init__(self, broker: Broker | None) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        if self.broker is None:
            for read in DATABASE_METRICS:
                yield read()
        for read_for in BROKER_METRICS:
            yield read_for(self.broker)


class _ProcessCollector:
    """This process's own counters (no multi-process directory: a single process)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def metrics_text(*, broker: Broker | None = None) -> bytes:
    """Every series (``broker=None``), or ``broker``'s own: the gauges labelled with it."""
    registry = CollectorRegistry()
    if broker is None:  # the counters are the service's, not a broker's
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.MultiProcessCollector(registry)
        else:
            registry.register(_ProcessCollector())  # type: ignore[arg-type]
    registry.register(_DatabaseCollector(broker))  # type: ignore[arg-type]
    return generate_latest(registry)


class MetricsView(APIView):
    """Prometheus text format; an API key with the ``metrics`` scope."""

    permission_classes = [HasScope]
    required_scope = ApiKeyScope.METRICS

    @extend_schema(exclude=True)
    def get(self, request: Request) -> HttpResponse:
        api_key = request.auth
        assert isinstance(api_key, ApiKey)  # HasScope let only an API key through
        return HttpResponse(metrics_text(broker=api_key.broker), content_type=CONTENT_TYPE_LATEST)


class CallbackMetricsMiddleware:
    """Counts every answer of the callback endpoints (accepted or refused)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith(_CALLBACK_PREFIX):
            endpoint = request.path[len(_CALLBACK_PREFIX) :].strip("/") or "unknown"
            if endpoint in ("deletion", "resolution", "isi"):
                CALLBACKS.labels(endpoint=endpoint, status=str(response.status_code)).inc()
        return response
