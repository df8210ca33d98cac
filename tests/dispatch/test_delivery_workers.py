"""Several workers, and a worker killed mid-delivery: nothing lost, nothing delivered twice
at once, nothing acknowledged delivered again.

These tests commit (other connections, threads and a worker process must see the rows).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings
from django.db import connection, connections, transaction
from procrastinate.contrib.django import app
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.broker_simulator import BrokerSimulator, Reply
from integrations import tasks
from integrations.dispatch.deliveries import deletion_requests_deliver
from integrations.models import Broker, DeletionRequest, DeliveryAttempt, LedgerEvent, RequestState
from tests.conftest import subprocess_env
from tests.webhook_factories import deletion_request, truncate_jobs, webhook_integration_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def empty_job_tables() -> Iterator[None]:
    yield from truncate_jobs()
    # The in-process worker's job threads keep their connections (CONN_MAX_AGE); close them
    # so the test database can be dropped at the end of the run.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def private_targets(settings) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def receiver() -> Iterator[BrokerSimulator]:
    with BrokerSimulator() as running:
        yield running


def _requests(broker: Broker, receiver: BrokerSimulator, n: int) -> list[DeletionRequest]:
    created = webhook_integration_for(broker, receiver.url)
    receiver.secrets = [created.webhook_secret]
    return [deletion_request(created.integration, remote_identifier=f"C-{i}") for i in range(n)]


def test_two_workers_on_the_same_requests_deliver_each_once(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    # Slow enough answers that both workers are busy at the same time.
    receiver.default_reply = Reply.slow(0.05)
    requests = _requests(broker, receiver, 12)
    ids = [r.pk for r in requests]
    results: list[Counter[str]] = []
    start = threading.Barrier(2)

    def worker(order: list[int]) -> None:
        try:
            start.wait()
            results.append(deletion_requests_deliver(request_ids=order, threads=1))
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=worker, args=(ids,)),
        threading.Thread(target=worker, args=(list(reversed(ids)),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    arrived = Counter(r.json["request_uuid"] for r in receiver.received)
    assert arrived == Counter({str(r.request_uuid): 1 for r in requests})
    assert sum(c["delivered"] for c in results) == 12
    assert sum(c["skipped"] for c in results) == 12
    assert DeliveryAttempt.objects.count() == 12
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {"dispatched"}
    assert LedgerEvent.objects.filter(kind="deletion_request.delivered").count() == 12


def test_a_batch_runs_on_several_threads_and_delivers_everything_once(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    requests = _requests(broker, receiver, 10)

    counts = deletion_requests_deliver(request_ids=[r.pk for r in requests], threads=4)

    assert counts == {"delivered": 10}
    assert sorted(r.json["request_uuid"] for r in receiver.received) == sorted(
        str(r.request_uuid) for r in requests
    )
    assert all(r.signature_ok for r in receiver.received)
    assert DeliveryAttempt.objects.filter(number=1).count() == 10


def test_a_worker_killed_mid_delivery_loses_nothing_and_acknowledges_once(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    # The first POST hangs, so the worker is killed while the broker holds it.
    receiver.script(Reply.slow(60))
    (request,) = _requests(broker, receiver, 1)
    with transaction.atomic():
        tasks.deletion_requests_enqueue([request.pk])

    env = subprocess_env(DROPPORTAL_ALLOW_PRIVATE_TARGETS="1")
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "procrastinate", "worker", "--queues", "dispatch"],
        cwd=django_settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        receiver.wait_for(1, timeout=60)
    finally:
        worker.kill()
        worker.wait(timeout=30)

    # The delivery's transaction died with the worker: still queued, nothing recorded.
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert not DeliveryAttempt.objects.exists()
    job = ProcrastinateJob.objects.get(task_name="integrations.tasks.deliver_deletion_requests")
    assert job.status == "doing"  # and its worker sends no heartbeat any more

    # The periodic task finds it (0 s: the dead worker's last heartbeat is in the past).
    assert asyncio.run(tasks.stalled_jobs_retry(seconds_since_heartbeat=0)) == 1
    job.refresh_from_db()
    assert job.status == "todo"
    _run_worker()

    request.refresh_from_db()
    assert request.state == RequestState.DISPATCHED
    first, second = receiver.received
    assert first.headers["X-Webhook-Id"] == second.headers["X-Webhook-Id"]  # broker dedupes
    assert DeliveryAttempt.objects.filter(deletion_request=request).count() == 1
    assert LedgerEvent.objects.filter(kind="job.stalled_retried").count() == 1
    assert LedgerEvent.objects.filter(kind="deletion_request.delivered").count() == 1

    # Once acknowledged, a further run (another stale copy of the job) sends nothing.
    with transaction.atomic():
        tasks.deletion_requests_enqueue([request.pk])
    _run_worker()
    assert len(receiver.received) == 2


def _run_worker() -> None:
    with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
        app.run_worker(
            queues=["dispatch"], wait=False, install_signal_handlers=False, listen_notify=False
        )
