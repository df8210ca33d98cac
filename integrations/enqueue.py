"""Queueing jobs: the one module write services call to have work done later.

Jobs are deferred by task name (``App.configure_task``), so this module imports nothing of
the project: services queue work without importing the job definitions, and ``tasks.py``,
which runs services, sits on top of them. ``allow_unknown=False`` makes a misspelt name fail
at once instead of queueing a job no worker runs; the Django contrib app has imported every
``tasks.py`` before any of this runs. Call these inside the transaction that makes the work
due: the job exists exactly when that change committed, in a web request, a command or a job
(``_deferrer``)::

    deletion_requests_enqueue([1, 2, 3])                       # delivered in jobs of 100
    deletion_requests_enqueue([4], at=timezone.now() + delay)  # a retry, scheduled
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from procrastinate.contrib.django import app
from procrastinate.contrib.django.django_connector import DjangoConnector
from procrastinate.contrib.django.settings import settings as procrastinate_settings
from procrastinate.exceptions import AlreadyEnqueued
from procrastinate.jobs import JobDeferrer
from procrastinate.manager import JobManager

# The names the jobs are defined under (tasks.py passes them to ``@app.task``).
DELIVER_DELETION_REQUESTS = "integrations.tasks.deliver_deletion_requests"
DELIVER_RESOLUTION_REQUESTS = "integrations.tasks.deliver_resolution_requests"
DELIVER_SAAS_DELETIONS = "integrations.tasks.deliver_saas_deletions"
SEND_ALERT = "integrations.tasks.send_alert"
EVALUATE_ALERTS = "integrations.tasks.evaluate_alerts"
PULL_BROKER = "integrations.tasks.pull_broker"
REPORT_BROKER = "integrations.tasks.report_broker"
DELIVER_DIRECTIVE = "integrations.tasks.deliver_directive"

# Requests delivered by one job: each job locks, sends and records one batch together.
DISPATCH_BATCH = 100
# Jobs written by one INSERT.
_DEFER_CHUNK = 1000

# Jobs are written through Django's own connection, whatever connector the app has. The worker
# (``manage.py worker``) gives the app a connector of its own, a pool that commits each query:
# through it, a job queued by a job (a pull's deliveries, queued with the requests its import
# creates) committed at once, before the rows it names. The dispatch worker, woken at once,
# could run it first, find nothing due and end, and those requests then waited for something
# else to queue them. Through Django's connection the job commits with its rows, as it does
# for a pull by hand (``drop pull``), so a job's deliveries leave as promptly.
_IN_TRANSACTION = JobManager(DjangoConnector(alias=procrastinate_settings.DATABASE_ALIAS))


def _deferrer(task: str, **options: Any) -> JobDeferrer:
    deferrer = app.configure_task(task, allow_unknown=False, **options)
    deferrer.job_manager = _IN_TRANSACTION
    return deferrer


def _defer_batches(
    task: str, argument: str, ids: Sequence[int], *, size: int, at: dt.datetime | None
) -> None:
    jobs: list[dict[str, Any]] = [
        {argument: list(ids[i : i + size])} for i in range(0, len(ids), size)
    ]
    options: dict[str, Any] = {"schedule_at": at} if at is not None else {}
    deferrer = _deferrer(task, **options)
    for start in range(0, len(jobs), _DEFER_CHUNK):
        deferrer.batch_defer(*jobs[start : start + _DEFER_CHUNK])


def deletion_requests_enqueue(request_ids: Sequence[int], *, at: dt.datetime | None = None) -> None:
    """Deliver ``request_ids`` (now, or at ``at``), in jobs of ``DISPATCH_BATCH``."""
    _defer_batches(
        DELIVER_DELETION_REQUESTS, "request_ids", request_ids, size=DISPATCH_BATCH, at=at
    )


def resolution_requests_enqueue(
    request_ids: Sequence[int], *, at: dt.datetime | None = None
) -> None:
    """Deliver the identifier retrieval notifications ``request_ids``, in jobs of 100."""
    _defer_batches(
        DELIVER_RESOLUTION_REQUESTS, "request_ids", request_ids, size=DISPATCH_BATCH, at=at
    )


def saas_deletions_enqueue(deletion_ids: Sequence[int], *, at: dt.datetime | None = None) -> None:
    """One job per SaaS deletion: each has its own attempts and retries."""
    _defer_batches(DELIVER_SAAS_DELETIONS, "deletion_ids", deletion_ids, size=1, at=at)


def directive_deliver_enqueue(directive_id: int) -> None:
    """Write one directive to its service provider's S3 prefix."""
    _deferrer(DELIVER_DIRECTIVE).defer(directive_id=directive_id)


def alert_send_enqueue(*, channel: str, text: str, alert: dict[str, Any]) -> None:
    """Send one alert by one channel (retried by the job's own strategy).

    One lock per channel and alert: its messages go in the order they were queued. A clear
    queued while its raise waits for a retry (hours away after a few failed tries) waits
    behind it, so staff never read "Cleared" and then an "ALERT" that looks current."""
    lock = f"alert:{channel}:{alert['key']}"
    _deferrer(SEND_ALERT, lock=lock).defer(channel=channel, text=text, alert=alert)


def alerts_evaluate_enqueue() -> None:
    """Evaluate the alert conditions now rather than at the next periodic run.

    A service that records an event staff must hear of at once (a refused file, a refused
    package, a target disabled by a 410) calls this in the transaction that records it. One
    evaluation waiting is enough: it runs after that commit and sees every event before it.
    """
    try:
        # A savepoint: the refused duplicate must not abort the caller's transaction.
        with transaction.atomic():
            _deferrer(EVALUATE_ALERTS).defer()
    except AlreadyEnqueued:
        pass


def drop_pull_enqueue(*, broker_pk: int, broker_id: str, latest_cycle: int) -> bool:
    """Pull for one broker now (the periodic pull's job); False when one already waits.
    ``latest_cycle``: the pk of the broker's latest cycle as the caller sees it (0: none)."""
    return _broker_job_defer(
        PULL_BROKER, lock=f"pull:{broker_id}", broker_pk=broker_pk, latest_cycle=latest_cycle
    )


def drop_report_enqueue(*, broker_pk: int, broker_id: str) -> bool:
    """Report for one broker now (the periodic report's job); False when one already waits."""
    return _broker_job_defer(REPORT_BROKER, lock=f"report:{broker_id}", broker_pk=broker_pk)


def _broker_job_defer(task: str, *, lock: str, **task_kwargs: Any) -> bool:
    """One such job at a time per broker: the lock keeps a second from running beside the
    first, the queueing lock keeps a second from waiting behind one that has not started (a
    ``download.ready`` notification and the periodic pull may ask within seconds)."""
    try:
        # A savepoint: the refused duplicate must not abort the caller's transaction.
        with transaction.atomic():
            _deferrer(task, lock=lock, queueing_lock=lock).defer(**task_kwargs)
    except AlreadyEnqueued:
        return False
    return True
