"""Jobs are enqueued in the caller's transaction: a rolled-back change never runs its job."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.utils import timezone
from procrastinate.contrib.django import app
from procrastinate.contrib.django.models import ProcrastinateJob
from procrastinate.exceptions import TaskNotFound
from procrastinate.periodic import PeriodicDeferrer

from integrations import enqueue, tasks
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerChainLink, LedgerEvent
from integrations.operations.metrics import metrics_text
from integrations.selectors.jobs import jobs_failed_since
from integrations.services.dispatch.jobs import stalled_jobs_retry
from integrations.services.ledger import ledger_event_append
from tests.builders import run_worker

T = TypeVar("T")

pytestmark = pytest.mark.django_db(transaction=True)

SEAL_TASK = "integrations.tasks.seal_ledger"


def test_job_enqueued_in_a_rolled_back_transaction_never_runs() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
        tasks.seal_ledger.defer()
        raise RuntimeError("the change fails")
    assert not ProcrastinateJob.objects.filter(task_name=SEAL_TASK).exists()
    assert not LedgerEvent.objects.exists()


def test_job_enqueued_in_a_committed_transaction_runs() -> None:
    with transaction.atomic():
        event = ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
        job_id = tasks.seal_ledger.defer()
    job = ProcrastinateJob.objects.get(id=job_id)
    assert job.status == "todo"
    assert not LedgerChainLink.objects.exists()
    run_worker()
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert LedgerChainLink.objects.filter(event_id=event.id).exists()


def test_every_job_the_enqueue_module_names_is_defined_with_its_queue() -> None:
    names = {
        enqueue.DELIVER_DELETION_REQUESTS: "dispatch",
        enqueue.DELIVER_RESOLUTION_REQUESTS: "dispatch",
        enqueue.DELIVER_SAAS_DELETIONS: "dispatch",
        enqueue.SEND_ALERT: "alerts",
        enqueue.EVALUATE_ALERTS: "alerts",
        enqueue.PULL_BROKER: "drop",
        enqueue.DELIVER_DIRECTIVE: "dispatch",
    }
    for name, queue in names.items():
        assert app.tasks[name].queue == queue


def test_deliveries_are_enqueued_in_batches_and_a_scheduled_retry_keeps_its_time() -> None:
    when = timezone.now() + dt.timedelta(hours=1)
    with transaction.atomic():
        enqueue.deletion_requests_enqueue(list(range(1, 251)))
        enqueue.saas_deletions_enqueue([7, 8])
        enqueue.resolution_requests_enqueue([9], at=when)
    jobs = ProcrastinateJob.objects.order_by("id")
    deletions = [
        j.args["request_ids"] for j in jobs if j.task_name == enqueue.DELIVER_DELETION_REQUESTS
    ]
    assert [len(batch) for batch in deletions] == [100, 100, 50]
    saas = [j.args for j in jobs if j.task_name == enqueue.DELIVER_SAAS_DELETIONS]
    assert saas == [{"deletion_ids": [7]}, {"deletion_ids": [8]}]
    (resolution,) = [j for j in jobs if j.task_name == enqueue.DELIVER_RESOLUTION_REQUESTS]
    assert (resolution.args, resolution.scheduled_at, resolution.queue_name) == (
        {"request_ids": [9]},
        when,
        "dispatch",
    )


def test_an_unknown_job_name_is_refused_instead_of_queued() -> None:
    with pytest.raises(TaskNotFound):
        enqueue._defer_batches("integrations.tasks.no_such_job", "ids", [1], size=1, at=None)
    assert not ProcrastinateJob.objects.exists()


def test_an_alert_evaluation_is_queued_once_and_only_when_its_event_commits() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue.alerts_evaluate_enqueue()
        raise RuntimeError("the event is rolled back")
    assert not ProcrastinateJob.objects.filter(task_name=enqueue.EVALUATE_ALERTS).exists()

    with transaction.atomic():
        enqueue.alerts_evaluate_enqueue()
        enqueue.alerts_evaluate_enqueue()  # already waiting: the caller's transaction goes on
        event = ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
    assert LedgerEvent.objects.filter(pk=event.pk).exists()
    (job,) = ProcrastinateJob.objects.filter(task_name=enqueue.EVALUATE_ALERTS)
    assert (job.status, job.queue_name) == ("todo", "alerts")


def _worker_silent_for(seconds: int) -> int:
    """A worker (its row) whose last heartbeat is ``seconds`` old, running a job: its id."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat)"
            " VALUES (now() - make_interval(secs => %s)) RETURNING id",
            [seconds],
        )
        (worker_id,) = cursor.fetchone()
    job_id = tasks.seal_ledger.defer()
    ProcrastinateJob.objects.filter(id=job_id).update(status="doing", worker_id=worker_id)
    return job_id


def test_a_worker_that_starts_leaves_the_jobs_of_one_silent_less_than_a_minute_alone() -> None:
    """A job runs again once its worker's heartbeat is STALLED_AFTER_SECONDS old, not before:
    a worker starting (a restart, the resume after an outage, another host's) forgets the
    workers it takes for dead, and their jobs then look stalled whatever their heartbeat."""
    job_id = _worker_silent_for(tasks.STALLED_AFTER_SECONDS - 15)  # late, but alive

    run_worker(["ledger"])  # another worker starts (and ends: nothing of its queue waits)

    retried = asyncio.run(stalled_jobs_retry(seconds_since_heartbeat=tasks.STALLED_AFTER_SECONDS))
    assert retried == 0
    assert ProcrastinateJob.objects.get(id=job_id).status == "doing"


def test_a_daily_job_missed_while_no_worker_ran_runs_when_one_starts() -> None:
    """The nightly verify and the daily anchor, missed by a restart or an outage over their
    minute, run when a worker starts again, not a day late: Procrastinate's own default
    forgets a run more than 10 minutes old. (A run already deferred is not deferred again:
    the database keeps one per time.)"""
    deferrer = PeriodicDeferrer(registry=app.periodic_registry, **app.periodic_defaults)
    # No worker from 03:00 to 04:30 UTC: the first one to start looks back from 04:30.
    back = dt.datetime(2026, 11, 30, 4, 30, tzinfo=dt.UTC)

    due = {(pt.periodic_id, when) for pt, when in deferrer.get_previous_tasks(back.timestamp())}

    verify = dt.datetime(2026, 11, 30, 3, 23, tzinfo=dt.UTC)
    anchor = dt.datetime(2026, 11, 30, 4, 7, tzinfo=dt.UTC)
    assert ("verify_ledger", int(verify.timestamp())) in due
    assert ("anchor_ledger", int(anchor.timestamp())) in due


def _its_connection_closed() -> None:
    connection.close()  # the connection of the thread this runs on


def _run_on_asgiref_thread(work: Coroutine[Any, Any, T]) -> T:
    """``work`` run: the job manager's and the ledger's queries run on asgiref's one thread,
    whose connection starts afresh (a previous test's may have been ended) and ends with it."""
    asyncio.run(sync_to_async(_its_connection_closed)())
    try:
        return asyncio.run(work)
    finally:
        asyncio.run(sync_to_async(_its_connection_closed)())


def test_a_stalled_job_that_ends_as_it_is_retried_is_left_alone_and_the_others_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker taken for dead may be alive, only late: it can finish a job between the
    moment the retry finds it stalled and the moment it retries it. That job is done; the
    others of the same run are still retried, and the run does not fail."""
    silent = tasks.STALLED_AFTER_SECONDS + 30
    ends = _worker_silent_for(silent)
    stays = tasks.deliver_deletion_requests.defer(request_ids=[])
    ProcrastinateJob.objects.filter(id=stays).update(
        status="doing", worker_id=ProcrastinateJob.objects.get(id=ends).worker_id
    )
    found = app.job_manager.get_stalled_jobs

    async def and_its_worker_finishes_one(**kwargs: Any) -> Any:
        stalled = sorted(await found(**kwargs), key=lambda job: job.id or 0)
        assert [job.id for job in stalled] == [ends, stays]
        await sync_to_async(ProcrastinateJob.objects.filter(id=ends).update)(status="succeeded")
        return stalled

    monkeypatch.setattr(app.job_manager, "get_stalled_jobs", and_its_worker_finishes_one)

    retried = _run_on_asgiref_thread(
        stalled_jobs_retry(seconds_since_heartbeat=tasks.STALLED_AFTER_SECONDS)
    )

    assert retried == 1
    assert ProcrastinateJob.objects.get(id=ends).status == "succeeded"
    assert ProcrastinateJob.objects.get(id=stays).status == "todo"
    (event,) = LedgerEvent.objects.filter(kind=LedgerKind.JOB_STALLED_RETRIED)
    assert event.subject == str(stays)


def test_a_stalled_job_whose_next_run_already_waits_ends_aborted_not_failed() -> None:
    """A worker killed mid-job (a deploy's stop timeout) while the same periodic job's next
    run waits: that run does the work, and the stalled one cannot wait beside it (one
    queueing lock). Nothing failed: no ``jobs_failed`` alert, no
    ``dropportal_jobs{status="failed"}`` for someone to look at."""
    stalled = _worker_silent_for(tasks.STALLED_AFTER_SECONDS + 30)
    waiting = tasks.seal_ledger.defer()  # its next run, deferred while the worker hung

    retried = _run_on_asgiref_thread(
        stalled_jobs_retry(seconds_since_heartbeat=tasks.STALLED_AFTER_SECONDS)
    )

    assert retried == 1
    assert ProcrastinateJob.objects.get(id=stalled).status == "aborted"
    assert ProcrastinateJob.objects.get(id=waiting).status == "todo"
    (event,) = LedgerEvent.objects.filter(kind=LedgerKind.JOB_STALLED_RETRIED)
    assert (event.subject, event.data["superseded_by_waiting_job"]) == (str(stalled), True)
    assert jobs_failed_since(timezone.now() - dt.timedelta(days=1)) == []
    assert 'status="failed"' not in metrics_text().decode()


def _job_finished(status: str, *, days_ago: int) -> int:
    job_id = tasks.deliver_deletion_requests.defer(request_ids=[])
    ProcrastinateJob.objects.filter(id=job_id).update(status=status)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_events SET at = now() - make_interval(days => %s)"
            " WHERE job_id = %s",
            [days_ago, job_id],
        )
    return job_id


def test_succeeded_and_aborted_jobs_are_forgotten_after_a_week_and_failed_ones_kept() -> None:
    """Every minute writes jobs (the sealing, the stalled jobs' retry), every delivery batch
    one: without an end, the jobs and their events grow for as long as the service runs, and
    each scrape of ``dropportal_jobs`` reads them all. An aborted job (a stalled one its next
    run superseded) needs no look either."""
    old = _job_finished("succeeded", days_ago=8)
    aborted = _job_finished("aborted", days_ago=8)
    recent = _job_finished("succeeded", days_ago=6)
    failed = _job_finished("failed", days_ago=60)
    waiting = tasks.deliver_deletion_requests.defer(request_ids=[1])

    _run_on_asgiref_thread(tasks.purge_finished_jobs())

    assert set(ProcrastinateJob.objects.values_list("id", flat=True)) == {
        recent,
        failed,
        waiting,
    }
    assert not {old, aborted} & set(ProcrastinateJob.objects.values_list("id", flat=True))
