"""The job queue as staff need to hear of it: jobs that failed for good (their retries
spent, or none allowed), which nothing runs again by itself."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Count, Max
from procrastinate.contrib.django.models import ProcrastinateEvent


@dataclass(frozen=True)
class FailedJobs:
    task: str
    count: int
    last_at: dt.datetime


def jobs_failed_since(since: dt.datetime) -> list[FailedJobs]:
    """Per task, the jobs that failed for good since ``since`` (Procrastinate's ``failed``
    events: a retry to come is ``deferred_for_retry``; a stalled job its waiting next run
    supersedes ends ``aborted``), and when the last one did."""
    rows = (
        ProcrastinateEvent.objects.filter(type="failed", at__gte=since)
        .values("job__task_name")
        .annotate(count=Count("id"), last_at=Max("at"))
        .order_by("job__task_name")
    )
    return [FailedJobs(r["job__task_name"], r["count"], r["last_at"]) for r in rows]
