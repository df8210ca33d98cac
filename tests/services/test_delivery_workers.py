"""Several workers, and a worker killed mid-delivery: nothing lost, nothing delivered twice
at once, nothing acknowledged delivered again.

These tests commit (other connections, threads and a worker process must see the rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings
from django.db import connections, transaction
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob
from procrastinate.exceptions import AlreadyEnqueued

from devtools.broker_simulator import BrokerSimulator, Reply
from integrations import enqueue, tasks
from integrations.models import Broker, DeletionRequest, DeliveryAttempt, LedgerEvent, RequestState
from integrations.services.dispatch import delivery_loop
from integrations.services.dispatch.deliveries import deletion_requests_deliver
from integrations.services.dispatch.dispatch_slots import broker_slot_take
from integrations.services.dispatch.jobs import stalled_jobs_retry
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    DeletionRequestFactory,
    run_worker,
    webhook_integration_created,
)
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_targets(settings) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def receiver() -> Iterator[BrokerSimulator]:
    with BrokerSimulator() as running:
        yield running


def _requests(broker: Broker, receiver: BrokerSimulator, n: int) -> list[DeletionRequest]:
    created = webhook_integration_created(broker, receiver.url)
    receiver.secrets = [created.webhook_secret]
    return [
        DeletionRequestFactory.create(integration=created.integration, remote_identifier=f"C-{i}")
        for i in range(n)
    ]


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
    # The other's: done when it was looked for, or still locked (then queued again for
    # later, in case the other's transaction rolls back; that job finds it delivered).
    assert sum(c["skipped"] + c["deferred"] for c in results) == 12
    assert DeliveryAttempt.objects.count() == 12
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {"dispatched"}
    assert LedgerEvent.objects.filter(kind="deletion_request.delivered").count() == 12


def test_a_request_another_transaction_holds_keeps_a_job_of_its_own(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    # A stalled-job retry ran this job while the first worker, still draining, held the
    # row; that worker killed, its transaction rolled back: the row was queued, due, and
    # in no job, for ever.
    (request,) = _requests(broker, receiver, 1)
    ProcrastinateJob.objects.all().delete()  # the job the creation queued: lost
    holder = threading.Event()
    release = threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                DeletionRequest.objects.select_for_update().get(pk=request.pk)
                holder.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    holder.wait(10)
    try:
        counts = deletion_requests_deliver(request_ids=[request.pk])
    finally:
        release.set()
        thread.join()

    assert counts == {"deferred": 1}
    (job,) = ProcrastinateJob.objects.filter(task_name=enqueue.DELIVER_DELETION_REQUESTS)
    assert job.args == {"request_ids": [request.pk]}
    assert job.scheduled_at is not None and job.scheduled_at > timezone.now()
    assert receiver.received == []  # nothing sent twice meanwhile


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
        enqueue.deletion_requests_enqueue([request.pk])

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
    assert asyncio.run(stalled_jobs_retry(seconds_since_heartbeat=0)) == 1
    job.refresh_from_db()
    assert job.status == "todo"
    run_worker(["dispatch"])

    request.refresh_from_db()
    assert request.state == RequestState.DISPATCHED
    first, second = receiver.received
    assert first.headers["X-Webhook-Id"] == second.headers["X-Webhook-Id"]  # broker dedupes
    assert DeliveryAttempt.objects.filter(deletion_request=request).count() == 1
    assert LedgerEvent.objects.filter(kind="job.stalled_retried").count() == 1
    assert LedgerEvent.objects.filter(kind="deletion_request.delivered").count() == 1

    # Once acknowledged, a further run (another stale copy of the job) sends nothing.
    with transaction.atomic():
        enqueue.deletion_requests_enqueue([request.pk])
    run_worker(["dispatch"])
    assert len(receiver.received) == 2


def test_a_broker_whose_dispatch_slots_are_taken_waits_and_the_others_are_delivered(
    broker: Broker, receiver: BrokerSimulator, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DROPPORTAL_DISPATCH_SLOTS_PER_BROKER = 1
    monkeypatch.setattr(delivery_loop, "SLOT_WAIT_SECONDS", 0.05)
    other = broker_create(broker_id="5930", name="Other", actor="test")
    with BrokerSimulator() as other_receiver:
        slow = _requests(broker, receiver, 2)
        fine = _requests(other, other_receiver, 2)
        held, release = threading.Event(), threading.Event()

        def slow_batch_in_flight() -> None:
            # Another worker's batch to 4821, its calls taking their whole timeout.
            try:
                with transaction.atomic():
                    assert broker_slot_take("4821")
                    held.set()
                    release.wait(60)
            finally:
                connections.close_all()

        holder = threading.Thread(target=slow_batch_in_flight)
        holder.start()
        try:
            assert held.wait(30)
            counts = deletion_requests_deliver(request_ids=[r.pk for r in slow + fine])
        finally:
            release.set()
            holder.join()

        assert counts == {"delivered": 2, "deferred": 2}
        assert len(other_receiver.received) == 2
        assert not receiver.received
        # Left as they were (no attempt counted) and their job deferred, not waited on.
        for request in slow:
            request.refresh_from_db()
            assert (request.state, request.attempts) == (RequestState.QUEUED, 0)
        (later,) = ProcrastinateJob.objects.filter(
            task_name="integrations.tasks.deliver_deletion_requests",
            args={"request_ids": [r.pk for r in slow]},
        )
        assert later.scheduled_at is not None and later.scheduled_at > timezone.now()

        # Once the slot is free again, they go.
        again = deletion_requests_deliver(request_ids=[r.pk for r in slow])
        assert again == {"delivered": 2}


def test_deliveries_to_a_slow_broker_do_not_hold_up_drop_and_ledger_jobs(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    # Every call takes its whole timeout: the delivery job holds its slot for 45 s or so.
    receiver.default_reply = Reply.slow(60)
    requests = _requests(broker, receiver, 20)
    with transaction.atomic():
        enqueue.deletion_requests_enqueue([r.pk for r in requests])

    worker = subprocess.Popen(
        [sys.executable, "manage.py", "worker", "--concurrency", "1"],
        cwd=django_settings.BASE_DIR,
        env=subprocess_env(DROPPORTAL_ALLOW_PRIVATE_TARGETS="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its worker processes are killed with it
    )
    try:
        receiver.wait_for(1, timeout=90)  # the only dispatch slot is taken now
        for task in (tasks.report_due, tasks.seal_ledger):
            with contextlib.suppress(AlreadyEnqueued), transaction.atomic():
                task.defer()
        finished = _wait_for_jobs(
            ["integrations.tasks.report_due", "integrations.tasks.seal_ledger"], timeout=120
        )
        dispatch = ProcrastinateJob.objects.get(
            task_name="integrations.tasks.deliver_deletion_requests"
        )
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)

    assert finished, "the DROP and ledger jobs did not run"
    assert dispatch.status == "doing"  # they ran while the slow delivery was still going


def _wait_for_jobs(task_names: list[str], *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = ProcrastinateJob.objects.filter(task_name__in=task_names, status="succeeded")
        if set(done.values_list("task_name", flat=True)) == set(task_names):
            return True
        time.sleep(0.05)
    return False
