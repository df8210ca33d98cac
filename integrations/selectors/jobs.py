"""The job queue as staff need to hear of it: jobs that failed for good (their retries
spent, or none allowed), which nothing runs again by itself."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Count, Max
from procrastinate.contrib.django.models import ProcrastinateEvent

from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerEvent


@dataclass(frozen=True)
class FailedJobs:
    task: str
    count: int
    last_at: dt.datetime


def jobs_failed_since(since: dt.datetime) -> list[FailedJobs]:
    """Per task, the jobs that failed for good since ``since`` (Procrastinate's ``failed``
    events: a retry to come is ``deferred_for_retry``), and when the last one did. Not a
    stalled job ended as failed because its next run was already waiting (a worker killed
    mid-job, as a deploy does): that run does the work (``job.stalled_retried`` with
    ``superseded_by_waiting_job``)."""
    superseded = [
        int(subject)
        for subject in LedgerEvent.objects.filter(
            kind=LedgerKind.JOB_STALLED_RETRIED,
            created_at__gte=since,
            data__superseded_by_waiting_job=True,
        ).values_list("subject", flat=True)
        if subject.isdigit()
    ]
    rows = (
        ProcrastinateEvent.objects.filter(type="failed", at__gte=since)
        .exclude(job_id__in=superseded)
        .values("job__task_name")
        .annotate(count=Count("id"), last_at=Max("at"))
        .order_by("job__task_name")
    )
    return [FailedJobs(r["job__task_name"], r["count"], r["last_at"]) for r in rows]
