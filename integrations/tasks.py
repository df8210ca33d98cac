"""Job definitions (Procrastinate). Thin: they load rows and call services.

The top layer beside the admin, API and commands: jobs import services, never the reverse.
Services queue jobs through ``integrations.enqueue``, by the task names defined there, inside
the transaction that makes the work due.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone
from procrastinate import RetryStrategy
from procrastinate.contrib.django import app
from procrastinate.jobs import Job
from procrastinate.retry import RetryDecision

from integrations import enqueue
from integrations.dispatch.alerts import AlertRefused, alert_send
from integrations.models import Broker
from integrations.services.cycle.drop import DropPullBusy, DropPullError, drop_pull
from integrations.services.cycle.drop_schedule import (
    drop_pulls_enqueue_due,
    drop_reports_enqueue_due,
)
from integrations.services.cycle.outstanding import outstanding_cycles_clear
from integrations.services.cycle.recurring import recurring_rounds_send_all
from integrations.services.cycle.recurring_counts import recurring_counts_store
from integrations.services.dispatch.deliveries import (
    deletion_requests_deliver,
    resolution_requests_deliver,
    saas_deletions_deliver,
)
from integrations.services.dispatch.jobs import finished_jobs_purge, stalled_jobs_retry
from integrations.services.dispatch.redelivery import deletion_requests_redispatch_failed
from integrations.services.dispatch.resolutions import resolutions_purge_final
from integrations.services.ledger import SYSTEM_ACTOR, ledger_seal, ledger_verify_record
from integrations.services.ledger_anchors import ledger_anchor, ledger_anchors_verify_record
from integrations.services.providers.directives import directive_deliver
from integrations.services.reporting.report_uploads import ReportBusy, report_client_for
from integrations.services.reporting.reports import report_auto
from integrations.services.staff.alerts import alerts_evaluate
from integrations.services.staff.doctor import stuck_work_items_check
from integrations.services.staff.shown_once import shown_once_purge_expired
from integrations.services.staff.staff_mfa import staff_sessions_purge_expired

log = logging.getLogger(__name__)


@app.periodic(cron="* * * * *", periodic_id="ledger_seal")
@app.task(queue="ledger", queueing_lock="ledger_seal", pass_context=False)
def seal_ledger(timestamp: int | None = None) -> int:
    """Chain the events written since the last seal (every minute)."""
    return ledger_seal()


# A delivery job fails only on an unexpected error (database down, unreadable secret): run it
# again later. Re-running is safe: what was acknowledged is no longer due.
DELIVERY_JOB_RETRY = RetryStrategy(
    max_attempts=8, exponential_wait=4
)  # waits 4 s, 16 s, ... 18 h: eight tries over about a day


@app.task(
    name=enqueue.DELIVER_DELETION_REQUESTS,
    queue="dispatch",
    pass_context=False,
    retry=DELIVERY_JOB_RETRY,
)
def deliver_deletion_requests(request_ids: list[int]) -> None:
    """Deliver each request that is still due (a re-run after a crash skips delivered ones)."""

    deletion_requests_deliver(request_ids=request_ids)


@app.task(
    name=enqueue.DELIVER_RESOLUTION_REQUESTS,
    queue="dispatch",
    pass_context=False,
    retry=DELIVERY_JOB_RETRY,
)
def deliver_resolution_requests(request_ids: list[int]) -> None:
    """Deliver each identifier retrieval notification that is still due."""

    resolution_requests_deliver(request_ids=request_ids)


@app.task(
    name=enqueue.DELIVER_SAAS_DELETIONS,
    queue="dispatch",
    pass_context=False,
    retry=DELIVERY_JOB_RETRY,
)
def deliver_saas_deletions(deletion_ids: list[int]) -> None:
    """Send each SaaS deletion that is still due."""

    saas_deletions_deliver(deletion_ids=deletion_ids)


@app.periodic(cron="17 * * * *", periodic_id="purge_resolved_identifiers")
@app.task(queue="maintenance", queueing_lock="purge_resolved_identifiers", pass_context=False)
def purge_resolved_identifiers(timestamp: int | None = None) -> int:
    """Hourly: purge resolved identifiers no SaaS deletion needs any more (a safety net)."""

    return resolutions_purge_final()


@app.periodic(cron="41 * * * *", periodic_id="redispatch_failed")
@app.task(queue="maintenance", queueing_lock="redispatch_failed", pass_context=False)
def redispatch_failed(timestamp: int | None = None) -> int:
    """Hourly, when ``DROPPORTAL_AUTO_REDISPATCH_HOURS`` is set: send failed outcomes that
    old again (``services.dispatch.redelivery.deletion_requests_redispatch_failed``)."""

    hours = settings.DROPPORTAL_AUTO_REDISPATCH_HOURS
    if hours <= 0:
        return 0
    return deletion_requests_redispatch_failed(
        failed_before=timezone.now() - dt.timedelta(hours=hours)
    )


# A worker that stops sending heartbeats for this long is taken for dead (killed, host
# lost); the jobs it was running are run again by another worker. The same bound has a
# starting worker forget it (PROCRASTINATE_WORKER_DEFAULTS).
STALLED_AFTER_SECONDS = settings.DROPPORTAL_WORKER_STALLED_SECONDS


@app.periodic(cron="* * * * *", periodic_id="retry_stalled_jobs")
@app.task(queue="maintenance", queueing_lock="retry_stalled_jobs", pass_context=False)
async def retry_stalled_jobs(timestamp: int | None = None) -> int:
    """Run again the jobs of workers that died mid-job (every minute); returns how many."""
    return await stalled_jobs_retry(seconds_since_heartbeat=STALLED_AFTER_SECONDS)


# Succeeded and aborted jobs are kept this long (to read what ran, in the job tables), then
# forgotten: the sealing and the stalled jobs' retry alone write one a minute each, every
# delivery batch one, and without an end the tables, and each scrape of dropportal_jobs, grew
# for ever.
FINISHED_JOBS_KEPT_HOURS = 7 * 24


@app.periodic(cron="47 2 * * *", periodic_id="purge_finished_jobs")
@app.task(queue="maintenance", queueing_lock="purge_finished_jobs", pass_context=False)
async def purge_finished_jobs(timestamp: int | None = None) -> None:
    """Nightly: forget the jobs that succeeded or were aborted a week ago (failed ones stay)."""
    await finished_jobs_purge(finished_hours_ago=FINISHED_JOBS_KEPT_HOURS)


# Reporting to DROP: every 15 minutes each broker with a DROP API key (not one DROP refused:
# brokers_due_for_report) gets one report job
# (settle what is final, write the files of complete cycles, amendments, upload whatever is
# written). The queueing lock keeps one waiting per broker, the lock one running.
REPORT_CRON = "*/15 * * * *"


@app.periodic(cron=REPORT_CRON, periodic_id="report_due")
@app.task(queue="drop", queueing_lock="report_due", pass_context=False)
def report_due(timestamp: int | None = None) -> int:
    """Defer a report job per broker that reports automatically; returns how many."""

    return drop_reports_enqueue_due()


@app.periodic(cron=REPORT_CRON, periodic_id="forget_settled_cycles")
@app.task(queue="maintenance", queueing_lock="forget_settled_cycles", pass_context=False)
def forget_settled_cycles(timestamp: int | None = None) -> int:
    """Every 15 minutes: unmark the cycles of every broker left with no outstanding work
    item (``services.cycle.outstanding.outstanding_cycles_clear``), so that the probes of
    work items by state pass them by; returns how many. Every broker's: one whose files
    staff upload by hand runs no report job."""

    return outstanding_cycles_clear()


class DirectiveNotDelivered(Exception):
    """Raised so the job is retried: why is on the directive and in its ledger event."""


@app.task(
    name=enqueue.DELIVER_DIRECTIVE,
    queue="dispatch",
    pass_context=False,
    retry=DELIVERY_JOB_RETRY,
)
def deliver_directive(directive_id: int) -> None:
    """Write a directive to its service provider's S3 prefix (retried when it fails)."""

    if not directive_deliver(directive_id=directive_id):
        raise DirectiveNotDelivered(f"directive {directive_id} not written to S3")


@app.task(name=enqueue.REPORT_BROKER, queue="drop", pass_context=False)
def report_broker(broker_pk: int) -> None:
    """Report for one broker (``services.reporting.reports.report_auto``)."""

    broker = Broker.objects.get(pk=broker_pk)
    try:
        client = report_client_for(broker, actor=SYSTEM_ACTOR)
    except ValidationError as exc:
        # A stored key or base URL the DROP client refuses: retrying cannot help, and the
        # drop_settings_refused alert tells staff until they enter it again. (Any other
        # refusal of the run, a file that cannot be written, fails the job as before.)
        log.warning("report for %s not run: %s", broker.broker_id, " ".join(exc.messages))
        return
    try:
        run = report_auto(broker=broker, client=client)
    except ReportBusy as exc:
        log.info("report for %s skipped: %s", broker.broker_id, exc)
        return
    if run.error or run.rejected or run.refused:
        log.warning(
            "report for %s: %d file(s) rejected, %d refused; %s",
            broker.broker_id,
            len(run.rejected),
            len(run.refused),
            run.error or "no upload error",
        )


# Pulling from DROP: every hour, each broker whose auto-pull is on and whose last pull is
# `pull_interval_days` old (30 by default) gets one pull job: download, import, match. A
# failed pull leaves last_pulled_at alone, so the next hour tries again (a ledger event each
# time), except after a refused DROP key (401): then not until the key or URL changes. A 403
# (not eligible, no list selected) is fixed in DROP's portal: the next hour tries again.
# The lock keeps one pull per broker running, the queueing lock one waiting.
PULL_CRON = "41 * * * *"


@app.periodic(cron=PULL_CRON, periodic_id="pull_due")
@app.task(queue="drop", queueing_lock="pull_due", pass_context=False)
def pull_due(timestamp: int | None = None) -> int:
    """Defer a pull job per broker that is due (``services.cycle.drop_schedule``)."""

    return drop_pulls_enqueue_due(now=timezone.now())


# Queued by pull_due and by DROP's download.ready notification (drop_schedule.drop_pull_ask).
@app.task(name=enqueue.PULL_BROKER, queue="drop", pass_context=False)
def pull_broker(broker_pk: int, latest_cycle: int | None = None) -> str:
    """Pull for one broker (``services.cycle.drop.drop_pull``); returns the outcome.
    ``latest_cycle``: the broker's latest cycle when the job was asked for (None in a job
    queued before it was passed): a pull that ran since and imported a later one did its
    work."""

    broker = Broker.objects.get(pk=broker_pk)
    try:
        result = drop_pull(broker=broker, actor="system:auto-pull", after_cycle=latest_cycle)
        if result.outcome == "imported_meanwhile":
            log.info("DROP pull for broker %s skipped: %s", broker.broker_id, result.message)
        return result.outcome
    except DropPullBusy as exc:
        # Staff are pulling it by hand right now: that pull is this one.
        log.info("DROP pull for broker %s skipped: %s", broker.broker_id, exc)
        return "busy"
    except DropPullError as exc:
        # Already in the ledger (drop.pull_failed); the next hour tries again.
        log.warning("DROP pull for broker %s failed: %s", broker.broker_id, exc)
        return "failed"


# Recurring deletion: hourly, each broker's rounds due today (DROP's calendar) are sent;
# a round sent is not due again until it is answered, so the hours after send nothing.
@app.periodic(cron="29 * * * *", periodic_id="recurring_due")
@app.task(queue="drop", queueing_lock="recurring_due", pass_context=False)
def recurring_due(timestamp: int | None = None) -> int:
    """``services.cycle.recurring.recurring_rounds_send_all``; returns how many work items
    got a round."""

    return recurring_rounds_send_all(actor="system:recurring")


# Stuck work items (``drop doctor``): hourly, so the dashboard's broker card says within the
# hour what no automatic path will move.
@app.periodic(cron="53 * * * *", periodic_id="drop_doctor")
@app.task(queue="maintenance", queueing_lock="drop_doctor", pass_context=False)
def drop_doctor(timestamp: int | None = None) -> int:
    """``services.staff.doctor.stuck_work_items_check``; returns how many groups it found."""

    return len(stuck_work_items_check(actor="system:doctor"))


# The dashboard's recurring deletion counts: every 5 minutes, so it shows them "counted at"
# a few minutes ago rather than read the whole schedule for each page. Two minutes past the
# alerts' evaluation, whose stuck check reads the same schedule: the two do not start together.
@app.periodic(cron="2-59/5 * * * *", periodic_id="count_recurring")
@app.task(queue="maintenance", queueing_lock="count_recurring", pass_context=False)
def count_recurring(timestamp: int | None = None) -> int:
    """``services.cycle.recurring_counts.recurring_counts_store``; returns how many brokers
    it counted."""

    return recurring_counts_store()


@app.periodic(cron="*/5 * * * *", periodic_id="purge_shown_once")
@app.task(queue="maintenance", queueing_lock="purge_shown_once", pass_context=False)
def purge_shown_once(timestamp: int | None = None) -> int:
    """Every 5 minutes: delete secrets shown once that nobody came to see within 10 minutes."""

    return shown_once_purge_expired()


@app.periodic(cron="13 3 * * *", periodic_id="purge_expired_sessions")
@app.task(queue="maintenance", queueing_lock="purge_expired_sessions", pass_context=False)
def purge_expired_sessions(timestamp: int | None = None) -> int:
    """Nightly: delete the admin's sessions past their expiry (``clearsessions``'s work)."""

    return staff_sessions_purge_expired()


# Alerts to staff (services/staff/alerts.py): conditions are evaluated every 5 minutes; each raise
# and clear defers one send_alert job per channel, retried for about a day (3 s, 9 s, ... the
# last 16 hours after the one before), one alert's messages in order (enqueue's lock); but
# not one the webhook refused for good (AlertRefused), which would hold the next ones back.
class _AlertSendRetry(RetryStrategy):
    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        if isinstance(exception, AlertRefused):
            return None
        return super().get_retry_decision(exception=exception, job=job)


ALERT_SEND_RETRY = _AlertSendRetry(max_attempts=10, exponential_wait=3)


@app.periodic(cron="*/5 * * * *", periodic_id="evaluate_alerts")
@app.task(
    name=enqueue.EVALUATE_ALERTS,
    queue="alerts",
    queueing_lock="evaluate_alerts",
    pass_context=False,
)
def evaluate_alerts(timestamp: int | None = None) -> int:
    """Raise and clear alerts (``services.staff.alerts.alerts_evaluate``); returns how many."""

    evaluated = alerts_evaluate()
    return len(evaluated.raised) + len(evaluated.cleared)


@app.task(name=enqueue.SEND_ALERT, queue="alerts", pass_context=False, retry=ALERT_SEND_RETRY)
def send_alert(channel: str, text: str, alert: dict[str, Any]) -> None:
    """Send one alert by one channel (``dispatch.alerts.alert_send``)."""

    alert_send(channel=channel, text=text, alert=alert)


@app.periodic(cron="23 3 * * *", periodic_id="verify_ledger")
@app.task(queue="ledger", queueing_lock="verify_ledger", pass_context=False)
def verify_ledger(timestamp: int | None = None) -> bool:
    """Nightly: ``ledger verify``, then the kept time-stamp tokens against the chain, each
    kept as a ledger event; a break, or a token that no longer holds, raises an alert."""

    chain_ok = ledger_verify_record().ok
    return ledger_anchors_verify_record() and chain_ok


# The chain anchored outside: daily, an RFC 3161 authority (DROPPORTAL_TSA_URL) timestamps
# the head. A failure is a ledger event and an alert, and the job is tried again (AnchorFailed
# raises): 6 more tries over about 5 hours, then the next day.
ANCHOR_RETRY = RetryStrategy(max_attempts=6, exponential_wait=5)


@app.periodic(cron="7 4 * * *", periodic_id="anchor_ledger")
@app.task(queue="ledger", queueing_lock="anchor_ledger", pass_context=False, retry=ANCHOR_RETRY)
def anchor_ledger(timestamp: int | None = None) -> int | None:
    """Daily, when ``DROPPORTAL_TSA_URL`` is set: ``ledger anchor``; returns the position."""

    if not settings.DROPPORTAL_TSA_URL:
        return None
    return ledger_anchor(actor="system:anchor").position
