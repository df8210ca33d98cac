"""Jobs of workers that died: run them again, each one a ledger event; and the jobs that
succeeded (or were aborted) long ago, forgotten.

The periodic ``retry_stalled_jobs`` job calls, every minute, and ``purge_finished_jobs``
nightly::

    retried = await stalled_jobs_retry(seconds_since_heartbeat=60)
    await finished_jobs_purge(finished_hours_ago=7 * 24)
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from procrastinate.contrib.django import app
from procrastinate.exceptions import ConnectorException, UniqueViolation
from procrastinate.jobs import Status

from integrations.ledger_kinds import LedgerKind
from integrations.services.ledger import ledger_event_append


async def stalled_jobs_retry(*, seconds_since_heartbeat: float) -> int:
    """Run again the jobs of workers silent for ``seconds_since_heartbeat``; how many."""
    stalled = list(
        await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=seconds_since_heartbeat)
    )
    retried = 0
    for job in stalled:
        superseded = False
        try:
            try:
                await app.job_manager.retry_job(job)
            except UniqueViolation:
                # Its queueing lock is taken by the same work waiting again (a periodic job's
                # next run, deferred while this one hung): that one does it. This one ends as
                # aborted, not failed: nothing failed, and staff look at failed jobs
                # (``jobs_failed``, ``dropportal_jobs{status="failed"}``).
                await app.job_manager.finish_job(job, status=Status.ABORTED, delete_job=False)
                superseded = True
        except ConnectorException:
            # Procrastinate refuses a job that succeeded (or was retried) since it was found:
            # its worker was late rather than dead. It is done; the others are still retried.
            # (One that worker ended as failed meanwhile is retried, as a failure would be.)
            assert job.id is not None
            if await app.job_manager.get_job_status_async(job.id) == Status.DOING:
                raise
            continue
        retried += 1
        await sync_to_async(job_stalled_record)(
            job_id=job.id,
            task=job.task_name,
            args=job.task_kwargs,
            worker=job.worker_id,
            superseded=superseded,
        )
    return retried


def job_stalled_record(
    *, job_id: int | None, task: str, args: dict[str, Any], worker: int | None, superseded: bool
) -> None:
    """The ledger event of one stalled job run again (or ended, ``superseded``)."""
    ledger_event_append(
        kind=LedgerKind.JOB_STALLED_RETRIED,
        subject=str(job_id),
        data={
            "task": task,
            "args": args,
            "worker": worker,
            "superseded_by_waiting_job": superseded,
        },
    )


async def finished_jobs_purge(*, finished_hours_ago: int) -> None:
    """Delete the jobs that succeeded, or were aborted (a stalled job superseded, or one a
    superuser aborted: a ledger event each), more than ``finished_hours_ago`` hours ago, and
    their events. Failed jobs stay: they need a look (``dropportal_jobs{status="failed"}``)."""
    await app.job_manager.delete_old_jobs(nb_hours=finished_hours_ago, include_aborted=True)
