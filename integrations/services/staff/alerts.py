"""Alerts to staff, without opening the admin: a registry of conditions, each evaluated by a
periodic job that raises an alert when the condition starts and clears it when it ends.

Each raise and each clear is one ``alert.raised`` / ``alert.cleared`` ledger event and one
message per channel (email to ``DROPPORTAL_ALERT_EMAILS`` through Django's mail, a JSON POST
to ``DROPPORTAL_ALERT_WEBHOOK_URL``), sent by jobs with retries, deferred in the transaction
that records it. The state (``AlertState``) is in the database, so a condition that lasts a
week alerts twice in all, whichever worker evaluates it::

    alerts_evaluate()   # the periodic job: returns what was raised and cleared

A condition is a function registered with ``@alert_condition(name)`` that returns what is
wrong now, one ``Firing`` per thing (a broker, an integration, a cycle)::

    @alert_condition("integration_disabled")
    def _disabled(now: dt.datetime) -> Iterable[Firing]:
        for integration in broker_targets(None, enabled=False):
            yield Firing(key=str(integration.uuid), broker_id=..., text="...")
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db import connection as db_connection
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from integrations.drop.calendar import drop_time_text, drop_today
from integrations.drop.client import DropAuthError
from integrations.drop.notifications import RESULTS_IN_PORTAL
from integrations.enqueue import alert_send_enqueue
from integrations.ledger_kinds import LedgerKind
from integrations.list_types import DATA_TYPE_OF
from integrations.models import (
    AlertState,
    Broker,
    CycleState,
    DropCycle,
    DropNotification,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    ReportKind,
    SaasConnection,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.canaries import canary_rounds_failing
from integrations.selectors.deadlines import cycle_deadlines
from integrations.selectors.directives import (
    directive_ack_due_date,
    directives_not_written,
    directives_overdue,
)
from integrations.selectors.drop_access import drop_access_obligations_open
from integrations.selectors.jobs import jobs_failed_since
from integrations.selectors.ledger import ledger_last_by_broker
from integrations.selectors.match_rates import match_rate_falls
from integrations.selectors.pulls import brokers_download_due
from integrations.selectors.report_reviews import report_files_awaiting_approval
from integrations.selectors.stuck import stuck_work_items
from integrations.selectors.targets import broker_targets
from integrations.services.cycle.drop import broker_drop_settings_problem
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append
from integrations.url_extras import data_without_url_extras, without_url_extras

log = logging.getLogger(__name__)

# An unreachable DROP alerts only once it has been so for this long (DROP has outages).
DROP_UNREACHABLE_FOR = dt.timedelta(days=1)
# DROP's word that results wait in its portal is a reminder: raised when it comes, cleared
# after this long (the service cannot see when staff have looked).
DROP_RESULTS_REMINDER = dt.timedelta(days=7)


@dataclass(frozen=True)
class Firing:
    """One thing a condition finds wrong: ``key`` names it within the condition (it clears
    when the key is no longer returned); ``text`` is the one line staff read."""

    key: str
    text: str
    broker_id: str = ""
    details: dict[str, Any] = field(default_factory=dict)


Condition = Callable[[dt.datetime], Iterable[Firing]]
CONDITIONS: dict[str, Condition] = {}


def alert_condition(name: str) -> Callable[[Condition], Condition]:
    """Register a condition under ``name`` (the ``condition`` of its alerts)."""

    def register(check: Condition) -> Condition:
        if name in CONDITIONS:
            raise ValueError(f"alert condition {name!r} is registered twice")
        CONDITIONS[name] = check
        return check

    return register


# pg_advisory_xact_lock(int, int): this purpose ("alrt"), the condition's name hashed.
_EVALUATION_LOCK_PURPOSE = 0x616C7274
_EVALUATION_LOCK = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"


@dataclass
class AlertsEvaluated:
    raised: list[AlertState] = field(default_factory=list)
    cleared: list[AlertState] = field(default_factory=list)


class AlertConditionsFailed(Exception):
    """Conditions that raised: the others were evaluated, theirs not (the job fails)."""


def alerts_evaluate(
    *, now: dt.datetime | None = None, conditions: Collection[str] | None = None
) -> AlertsEvaluated:
    """Evaluate every condition; raise what started, clear what ended (one transaction per
    condition, so one failing condition does not hold back the others' alerts: it is logged,
    its alerts stay as they were, and ``AlertConditionsFailed`` names it once all have run).
    ``conditions``: only these, by name (each evaluated as in a whole run); every one by
    default."""
    now = now or timezone.now()
    if conditions is not None and (unknown := set(conditions) - set(CONDITIONS)):
        raise ValueError(f"no alert condition {', '.join(sorted(unknown))}")
    result = AlertsEvaluated()
    failed: list[str] = []
    for name, check in CONDITIONS.items():
        if conditions is not None and name not in conditions:
            continue
        try:
            evaluated = _condition_evaluate(name, check, now)
        except (OperationalError, InterfaceError):
            raise  # the database itself: no other condition can be evaluated either
        except Exception:
            # A stored secret it cannot read, a bug: the conditions after it in the registry
            # (the canaries', the deadlines') must still raise and clear theirs.
            log.exception("alert condition %s could not be evaluated", name)
            failed.append(name)
            continue
        result.raised += evaluated.raised
        result.cleared += evaluated.cleared
    if failed:
        raise AlertConditionsFailed(f"alert condition(s) not evaluated: {', '.join(failed)}")
    return result


def _condition_evaluate(name: str, check: Condition, now: dt.datetime) -> AlertsEvaluated:
    """One condition, in one transaction: its raises and clears, their messages queued."""
    result = AlertsEvaluated()
    with transaction.atomic():
        # One evaluation of a condition at a time, whatever runs it: the periodic job and
        # one an event queued (its queueing lock keeps only a second from waiting) may run
        # together on two workers. Without it the second, not seeing the first's raise
        # until it commits, raised the same alert again (two messages), and a check read
        # before the other's commit could raise again what the other had just cleared.
        # Taken before the check, so the check sees every raise and clear before it.
        with db_connection.cursor() as cursor:
            cursor.execute(_EVALUATION_LOCK, [_EVALUATION_LOCK_PURPOSE, name])
        firing = {f"{name}:{f.key}": f for f in check(now)}
        states = {
            s.key: s
            for s in AlertState.objects.select_for_update().filter(condition=name, active=True)
        }
        for key in sorted(set(firing) - set(states)):
            result.raised.append(_raise(name, key, firing[key], now))
        for key in sorted(set(states) - set(firing)):
            result.cleared.append(_clear(states[key], now))
    return result


def _raise(condition: str, key: str, firing: Firing, now: dt.datetime) -> AlertState:
    state, _ = AlertState.objects.update_or_create(
        key=key,
        defaults={
            "condition": condition,
            "broker_id": firing.broker_id,
            "active": True,
            # Sent out of the process by mail and webhook: no URL's token or identifier.
            "text": without_url_extras(firing.text),
            "details": data_without_url_extras(firing.details),
            "raised_at": now,
            "cleared_at": None,
        },
    )
    _record(state, "raised", now)
    return state


def _clear(state: AlertState, now: dt.datetime) -> AlertState:
    state.active = False
    state.cleared_at = now
    state.save(update_fields=["active", "cleared_at"])
    _record(state, "cleared", now)
    return state


def _record(state: AlertState, change: str, now: dt.datetime) -> None:
    alert = {
        "condition": state.condition,
        "key": state.key,
        "state": change,
        "broker_id": state.broker_id,
        "text": state.text,
        "details": state.details,
        "raised_at": state.raised_at.isoformat(),
        "at": now.isoformat(),
    }
    ledger_event_append(
        kind=LedgerKind.ALERT_RAISED if change == "raised" else LedgerKind.ALERT_CLEARED,
        broker_id=state.broker_id,
        subject=state.key,
        actor=SYSTEM_ACTOR,
        data=alert,
    )
    text = f"[dropportal] {'ALERT' if change == 'raised' else 'Cleared'}: {state.text}"
    if settings.DROPPORTAL_ALERT_EMAILS:
        alert_send_enqueue(channel="email", text=text, alert=alert)
    if settings.DROPPORTAL_ALERT_WEBHOOK_URL:
        alert_send_enqueue(channel="webhook", text=text, alert=alert)


# --- The conditions ---------------------------------------------------------------------
# One more is a function here (or in any module imported at start) with @alert_condition.

_PULL_OUTCOME_KINDS = (
    LedgerKind.DROP_PULLED,
    LedgerKind.DROP_CYCLE_IMPORTED,
    LedgerKind.DROP_PULL_FAILED,
)


@alert_condition("drop_pull_failed")
def _drop_pull_failed(now: dt.datetime) -> Iterable[Firing]:
    """The broker's last pull failed: refused credentials (401/403), a refused package or
    another refusal at once; DROP unreachable once every pull has failed for a day."""
    last = ledger_last_by_broker(LedgerEvent.objects.filter(kind__in=_PULL_OUTCOME_KINDS))
    for event in last:
        if event.kind != LedgerKind.DROP_PULL_FAILED:
            continue
        reason = event.data.get("reason") or "unreachable"
        if reason == "unreachable":
            succeeded = (
                LedgerEvent.objects.filter(
                    broker_id=event.broker_id, kind__in=_PULL_OUTCOME_KINDS[:2]
                )
                .order_by("-id")
                .first()
            )
            first_failure = (
                LedgerEvent.objects.filter(
                    broker_id=event.broker_id,
                    kind=LedgerKind.DROP_PULL_FAILED,
                    id__gt=succeeded.id if succeeded else 0,
                )
                .order_by("id")
                .first()
            )
            assert first_failure is not None  # the last event is one
            if now - first_failure.created_at < DROP_UNREACHABLE_FOR:
                continue
        yield Firing(
            key=event.broker_id,
            broker_id=event.broker_id,
            text=f"DROP pull for broker {event.broker_id} failed: {event.data.get('error', '')}",
            details={"reason": reason, "status": event.data.get("status"), "event": event.id},
        )


# What ends a refusal of the broker's DROP key on an upload: DROP answering one (accepting,
# rejecting or refusing the file), or staff marking one uploaded by hand.
_UPLOAD_ANSWERED_KINDS = (
    LedgerKind.REPORT_FILE_ACCEPTED,
    LedgerKind.REPORT_FILE_REJECTED,
    LedgerKind.REPORT_FILE_REFUSED,
    LedgerKind.REPORT_FILE_MARKED_UPLOADED,
)


@alert_condition("drop_upload_refused")
def _drop_upload_refused(now: dt.datetime) -> Iterable[Firing]:
    """DROP refused the broker's key or account (401/403) on its last upload or amendment:
    every file waits, whatever the pulls do, until the broker fixes it in DROP's portal.
    Other failures of an upload are outages (``drop_access_obligation``)."""
    last = ledger_last_by_broker(
        LedgerEvent.objects.filter(
            Q(kind__in=_UPLOAD_ANSWERED_KINDS)
            | Q(kind=LedgerKind.REPORT_FILE_UPLOAD_FAILED, data__error_type=DropAuthError.__name__)
        )
    )
    for event in last:
        if event.kind != LedgerKind.REPORT_FILE_UPLOAD_FAILED:
            continue
        yield Firing(
            key=event.broker_id,
            broker_id=event.broker_id,
            text=f"DROP {event.data.get('kind', 'upload')} of {event.subject} for broker "
            f"{event.broker_id} failed: {event.data.get('error', '')}; check the broker's DROP "
            "API key and DROP account, then upload again (`drop report --upload`)",
            details={"status": event.data.get("status"), "event": event.id},
        )


@alert_condition("drop_settings_refused")
def _drop_settings_refused(now: dt.datetime) -> Iterable[Firing]:
    """The broker's stored DROP API key, or the URL it is sent to, is one DROP's client
    refuses (stored before it was checked on entry): every pull and upload fails until staff
    enter it again. It clears when they do."""
    # The key is encrypted, so it is read in Python; brokers are few.
    for broker in Broker.objects.order_by("broker_id"):
        problem = broker_drop_settings_problem(broker)
        if problem:
            yield Firing(
                key=broker.broker_id,
                broker_id=broker.broker_id,
                text=f"Broker {broker.broker_id} cannot reach DROP: {problem}; its pulls "
                "and uploads fail until it is entered again in the admin",
            )


@alert_condition("drop_lists_not_read")
def _drop_lists_not_read(now: dt.datetime) -> Iterable[Firing]:
    """The broker's latest package holds DROP lists that were not read (a type this version
    does not know, a header that is not ID,Hash): no status is reported for their work items
    until staff answer them in DROP's portal. It lasts until a later package comes, since
    DROP sends none while a work item of the previous one has no status."""
    latest = DropCycle.objects.order_by("broker_id", "-pk").distinct("broker_id")
    for cycle in latest.select_related("broker"):
        if not cycle.unread_files:
            continue
        named = "; ".join(f"{name}: {why}" for name, why in sorted(cycle.unread_files.items()))
        yield Firing(
            key=f"cycle:{cycle.pk}",
            broker_id=cycle.broker.broker_id,
            text=f"DROP package {cycle.zip_name} (broker {cycle.broker.broker_id}, cycle "
            f"{cycle.drop_session_id}) holds lists that were not read, so nothing is reported "
            f"for them: {named}",
            details={"drop_session_id": cycle.drop_session_id, "files": cycle.unread_files},
        )


@alert_condition("integration_disabled")
def _integration_disabled(now: dt.datetime) -> Iterable[Firing]:
    """An integration or SaaS connection is disabled: its deliveries wait."""
    # A retired one is gone for good, by staff's decision: nothing waits for it.
    for integration in broker_targets(None, enabled=False, retired=False):
        yield Firing(
            key=f"integration:{integration.uuid}",
            broker_id=integration.broker.broker_id,
            text=f"Integration {integration.name!r} of broker {integration.broker.broker_id} "
            f"is disabled ({integration.disabled_reason or 'no reason given'}); "
            "its deliveries wait until it is enabled",
            details={"integration_id": str(integration.uuid)},
        )
    for connection in SaasConnection.objects.filter(
        enabled=False, retired_at__isnull=True
    ).select_related("broker"):
        yield Firing(
            key=f"saas:{connection.pk}",
            broker_id=connection.broker.broker_id,
            text=f"SaaS connection {connection.name!r} of broker "
            f"{connection.broker.broker_id} is disabled "
            f"({connection.disabled_reason or 'no reason given'}); its deletions wait",
            details={"saas_connection": connection.pk},
        )


@alert_condition("upload_rejected")
def _upload_rejected(now: dt.datetime) -> Iterable[Firing]:
    """DROP rejected a response file whose work items still wait for staff (the periodic
    job does not write them again; ``drop report`` does)."""
    waiting = WorkItem.objects.filter(
        cycle_id=OuterRef("cycle_id"), pending_report_file_id=OuterRef("pk")
    ).exclude(state=WorkItemState.REMOVED)
    rejected = ReportFile.objects.filter(state=ReportFileState.REJECTED).filter(Exists(waiting))
    for report_file in rejected.select_related("broker", "cycle").defer("content"):
        yield Firing(
            key=f"report_file:{report_file.pk}",
            broker_id=report_file.broker.broker_id,
            text=f"DROP rejected {report_file.file_name} (broker "
            f"{report_file.broker.broker_id}, cycle {report_file.cycle.drop_session_id}): "
            f"{report_file.drop_response.get('reason', 'no reason given')}; its statuses "
            "are owed until `drop report --upload` sends them in a new file"
            + (" (or staff discard it)" if report_file.kind == ReportKind.AMEND else ""),
            details={"report_file": report_file.pk, "file_name": report_file.file_name},
        )


@alert_condition("drop_results_in_portal")
def _drop_results_in_portal(now: dt.datetime) -> Iterable[Firing]:
    """DROP processed an upload or an amendment (its ``*.processed`` notification): the
    row-level results wait for review in DROP's portal, which no API returns."""
    processed = DropNotification.objects.filter(
        event_type__in=list(RESULTS_IN_PORTAL), received_at__gt=now - DROP_RESULTS_REMINDER
    ).select_related("broker", "report_file")
    for notification in processed.defer("report_file__content"):
        broker_id = notification.broker.broker_id
        what = (
            notification.report_file.file_name
            if notification.report_file is not None
            else RESULTS_IN_PORTAL[notification.event_type]
        )
        yield Firing(
            key=f"notification:{notification.pk}",
            broker_id=broker_id,
            text=f"DROP processed {what} of broker {broker_id}: review its row-level results "
            f"in DROP's portal ({notification.message or 'no message'})",
            details={
                "event_id": notification.event_id,
                "event_type": notification.event_type,
                "report_file": notification.report_file_id,
            },
        )


@alert_condition("report_file_refused")
def _report_file_refused(now: dt.datetime) -> Iterable[Firing]:
    """DROP refused a response file on its own (a 409): every run sends it again, and none
    of its statuses reaches DROP until DROP takes it or staff discard it (an amendment)."""
    refused = ReportFile.objects.filter(state=ReportFileState.REFUSED)
    for report_file in refused.select_related("broker", "cycle").defer("content"):
        broker_id = report_file.broker.broker_id
        what_to_do = (
            "it is sent again each run; if DROP will not take it, discard it with a reason "
            f"(`manage.py drop report --broker {broker_id} --discard {report_file.file_name} "
            "--reason TEXT`, or the admin)"
            if report_file.kind == ReportKind.AMEND
            else "it is sent again each run; check the cycle with DROP"
        )
        yield Firing(
            key=f"file:{report_file.pk}",
            broker_id=broker_id,
            text=f"DROP refused {report_file.file_name} (broker {broker_id}, cycle "
            f"{report_file.cycle.drop_session_id}): "
            f"{report_file.drop_response.get('message', 'no message')}; {what_to_do}",
            details={
                "report_file": report_file.pk,
                "file_name": report_file.file_name,
                "kind": report_file.kind,
                "status": report_file.drop_response.get("status"),
            },
        )


def _cycles_due_within(days: int) -> Condition:
    def check(now: dt.datetime) -> Iterable[Firing]:
        for deadline in cycle_deadlines(today=drop_today(now)):
            if deadline.days_left > days:
                continue
            cycle = deadline.cycle
            when = (
                f"was due {-deadline.days_left} day(s) ago"
                if deadline.days_left < 0
                else f"is due in {deadline.days_left} day(s)"
            )
            yield Firing(
                key=f"cycle:{cycle.pk}",
                broker_id=cycle.broker.broker_id,
                text=f"DROP cycle {cycle.drop_session_id} of broker {cycle.broker.broker_id} "
                f"{when} ({cycle.due_date}) with {deadline.owed} status(es) still owed",
                details={
                    "due_date": cycle.due_date.isoformat(),
                    "owed": deadline.owed,
                    "waiting_for_outcomes": deadline.not_reportable,
                },
            )

    return check


# Days before a cycle's due date that its alerts start (the cycle's, and its files' waiting
# for approval).
DUE_ALERT_DAYS = (7, 2)
for _days in DUE_ALERT_DAYS:
    alert_condition(f"cycle_due_{_days}_days")(_cycles_due_within(_days))


def _approvals_due_within(days: int) -> Condition:
    """A file waits for approval (the broker's "approve uploads") while its cycle, still
    owing statuses, is due within ``days``: nothing sends it until a second person decides."""

    def check(now: dt.datetime) -> Iterable[Firing]:
        today = drop_today(now)
        for report_file in report_files_awaiting_approval().filter(cycle__state=CycleState.OPEN):
            cycle = report_file.cycle
            days_left = (cycle.due_date - today).days
            if days_left > days:
                continue
            broker_id = report_file.broker.broker_id
            when = (
                f"was due {-days_left} day(s) ago"
                if days_left < 0
                else f"is due in {days_left} day(s)"
            )
            yield Firing(
                key=f"file:{report_file.pk}",
                broker_id=broker_id,
                text=f"{report_file.file_name} (broker {broker_id}) waits for approval and its "
                f"cycle {cycle.drop_session_id} {when} ({cycle.due_date}): an Operator other "
                f"than {report_file.written_by or 'whoever wrote it'} approves it (`manage.py "
                f"drop report --broker {broker_id} --approve {report_file.file_name}`, or the "
                "admin)",
                details={
                    "report_file": report_file.pk,
                    "file_name": report_file.file_name,
                    "due_date": cycle.due_date.isoformat(),
                    "written_by": report_file.written_by,
                },
            )

    return check


for _days in DUE_ALERT_DAYS:
    alert_condition(f"approval_due_{_days}_days")(_approvals_due_within(_days))


@alert_condition("ledger_verify_failed")
def _ledger_verify_failed(now: dt.datetime) -> Iterable[Firing]:
    """The last nightly ``ledger verify`` found a break (``ledger.verified`` events)."""
    last = LedgerEvent.objects.filter(kind=LedgerKind.LEDGER_VERIFIED).order_by("-id").first()
    if last is not None and not last.data.get("ok", True):
        yield Firing(
            key="ledger",
            text=f"ledger verify failed: {last.data.get('first_break', 'a break')}; "
            "run `manage.py ledger verify` and compare with your exported chain hashes",
            details={"event": last.id},
        )


@alert_condition("ledger_anchor_failed")
def _ledger_anchor_failed(now: dt.datetime) -> Iterable[Firing]:
    """The last anchoring of the chain failed (``ledger.anchor_failed`` after the last
    ``ledger.anchored``); the next success clears it."""
    last = (
        LedgerEvent.objects.filter(
            kind__in=[LedgerKind.LEDGER_ANCHORED, LedgerKind.LEDGER_ANCHOR_FAILED]
        )
        .order_by("-id")
        .first()
    )
    if last is not None and last.kind == LedgerKind.LEDGER_ANCHOR_FAILED:
        yield Firing(
            key="ledger",
            text=f"the time-stamping authority did not anchor the ledger: "
            f"{last.data.get('error', 'no token')}; the worker tries again, "
            "`manage.py ledger anchor` does it at once",
            details={"event": last.id},
        )


@alert_condition("ledger_anchor_broken")
def _ledger_anchor_broken(now: dt.datetime) -> Iterable[Firing]:
    """The last nightly check of the kept time-stamp tokens found one that no longer covers
    the chain (``ledger.anchors_verified`` events): the chain was rewritten after it."""
    last = (
        LedgerEvent.objects.filter(kind=LedgerKind.LEDGER_ANCHORS_VERIFIED).order_by("-id").first()
    )
    if last is not None and not last.data.get("ok", True):
        problems = last.data.get("problems") or ["a token"]
        yield Firing(
            key="ledger",
            text=f"a time-stamp token no longer holds: {problems[0]}; run `manage.py ledger "
            "verify --tsa-cert FILE` and compare with the evidence packs' tokens",
            details={"event": last.id, "problems": last.data.get("problems_count", 1)},
        )


# How long a job that failed for good keeps its alert up: it is not run again by itself, and
# its row stays for a look (the purge keeps failed jobs).
JOBS_FAILED_ALERT_HOURS = 24


@alert_condition("jobs_failed")
def _jobs_failed(now: dt.datetime) -> Iterable[Firing]:
    """Jobs that failed for good in the last ``JOBS_FAILED_ALERT_HOURS``, one alert per
    task: a delivery batch whose retries ran out leaves its rows queued with no job, and a
    periodic job failing each run (this evaluation's own, a report, the rounds) stops what
    it does until someone looks."""
    since = now - dt.timedelta(hours=JOBS_FAILED_ALERT_HOURS)
    for failed in jobs_failed_since(since):
        yield Firing(
            key=failed.task,
            text=f"{failed.count} `{failed.task}` job(s) failed for good in the last "
            f"{JOBS_FAILED_ALERT_HOURS} hours, the last at {drop_time_text(failed.last_at)}: "
            "the worker's log says why; nothing runs them again by itself",
            details={"task": failed.task, "count": failed.count},
        )


@alert_condition("stuck_work")
def _stuck_work(now: dt.datetime) -> Iterable[Firing]:
    """``drop doctor`` finds open work items no automatic path brings to a status: one alert
    per broker and reason (its counts may change while it lasts)."""
    for group in stuck_work_items(now=now):
        yield Firing(
            key=f"{group.broker_id}:{group.reason}",
            broker_id=group.broker_id,
            text=f"{group.work_items} work item(s) of broker {group.broker_id} are stuck: "
            f"{group.label} (nearest due {group.nearest_due_date.isoformat()}); "
            f"see `manage.py drop doctor` or {settings.DROPPORTAL_PUBLIC_URL}{group.admin_path}",
            details=group.as_json(),
        )


# Days before the law's next download is due that its alert starts.
DOWNLOAD_DUE_ALERT_DAYS = 7


@alert_condition("drop_download_due")
def _drop_download_due(now: dt.datetime) -> Iterable[Firing]:
    """DROP requires a download at least every ``DROPPORTAL_DOWNLOAD_CADENCE_DAYS`` (45): a
    broker whose next one is due within a week, or overdue, whether it pulls by hand
    (automatic pulls off) or its automatic pulls keep failing. It clears with a download,
    a pull DROP answers "nothing new" included. A broker that never downloaded counts from
    its set-up in the service; none counts from before the duty began (1 August 2026,
    ``download_clock_from``)."""
    today = drop_today(now)
    for broker, due in brokers_download_due(today=today, within_days=DOWNLOAD_DUE_ALERT_DAYS):
        days_left = (due - today).days
        when = f"was due {-days_left} day(s) ago" if days_left < 0 else f"in {days_left} day(s)"
        pull = f"`manage.py drop pull --broker {broker.broker_id}`"
        # DROP refuses a download (409) while the last one's work items lack a status.
        owed = WorkItem.objects.filter(cycle__broker=broker).owed().exists()
        remedy = (
            f"report the open cycle's statuses first (`manage.py drop report --broker "
            f"{broker.broker_id} --upload`: DROP refuses a download until then), then {pull}"
            if owed
            else f"{pull} (or download it in DROP's portal and `manage.py drop import`)"
        )
        yield Firing(
            key=broker.broker_id,
            broker_id=broker.broker_id,
            text=f"Broker {broker.broker_id} must download from DROP by {due.isoformat()} "
            f"({when}), {settings.DROPPORTAL_DOWNLOAD_CADENCE_DAYS} days after its last "
            f"download (before a first, after its set-up here): {remedy}",
            details={
                "due_date": due.isoformat(),
                "auto_pull": broker.auto_pull,
                "statuses_owed": owed,
            },
        )


# -- DROP access obligations and the match-rate watch -------------------------------------


@alert_condition("drop_access_obligation")
def _drop_access_obligation(now: dt.datetime) -> Iterable[Firing]:
    """The automated DROP connection failed for more than a day through no doing of the
    broker's: it owes a download by hand and a written notice to CalPrivacy, through the
    DROP account, within 45 days of the failure (11 CCR 7612(b)(1)). Until staff record it."""
    today = drop_today(now)
    for obligation in drop_access_obligations_open():
        broker_id = obligation.broker.broker_id
        days_left = (obligation.due_date - today).days
        when = f"was due {-days_left} day(s) ago" if days_left < 0 else f"in {days_left} day(s)"
        yield Firing(
            key=f"obligation:{obligation.pk}",
            broker_id=broker_id,
            text=f"DROP was unreachable for broker {broker_id} for more than a day from "
            f"{drop_time_text(obligation.failure_started_at)}: download by hand in DROP's "
            "portal (then `manage.py drop import`) and notify CalPrivacy in writing through "
            f"the DROP account by {obligation.due_date.isoformat()} ({when}); then record it: "
            f"`manage.py drop notice --broker {broker_id} --sent DATE --reference TEXT`, "
            "or in the admin",
            details={
                "obligation": obligation.pk,
                "failure_started_at": obligation.failure_started_at.isoformat(),
                "due_date": obligation.due_date.isoformat(),
                "ongoing": obligation.outage.ended_at is None,
            },
        )


@alert_condition("match_rate_fell")
def _match_rate_fell(now: dt.datetime) -> Iterable[Firing]:
    """A list type of a broker's latest cycle matched at less than half its usual rate (the
    median of the previous cycles, up to three), with at least 100 items."""
    for fall in match_rate_falls():
        cycle = fall.cycle
        broker_id = cycle.broker.broker_id
        list_type = DATA_TYPE_OF.get(fall.hash_type, fall.hash_type)
        yield Firing(
            key=f"cycle:{cycle.pk}:{fall.hash_type}",
            broker_id=broker_id,
            text=f"The match rate of the {list_type} list fell to {float(fall.rate):.1%} "
            f"({fall.matched} of {fall.items}) in DROP cycle {cycle.drop_session_id} of broker "
            f"{broker_id}, below half its median of {float(fall.median):.1%} over the "
            f"previous {fall.previous} cycle(s): usually DROP changed its standardization "
            "rules or the broker's consumer export changed (a column, a format); check both "
            "before the cycle's statuses are reported",
            details={
                "drop_session_id": cycle.drop_session_id,
                "hash_type": fall.hash_type,
                "items": fall.items,
                "matched": fall.matched,
                "rate": round(float(fall.rate), 6),
                "median": round(float(fall.median), 6),
                "previous_cycles": fall.previous,
            },
        )


# -- service providers and contractors
@alert_condition("directive_not_acknowledged")
def _directive_not_acknowledged(now: dt.datetime) -> Iterable[Firing]:
    """A service provider has not acknowledged a directive within
    ``DROPPORTAL_DIRECTIVE_ACK_DAYS``: the broker cannot show it directed the deletion."""
    for directive in directives_overdue(now=now):
        broker_id = directive.broker.broker_id
        yield Firing(
            key=f"directive:{directive.pk}",
            broker_id=broker_id,
            text=f"{directive.provider.name} (broker {broker_id}) has not acknowledged "
            f"directive {directive.pk} ({directive.rows} consumers to delete, due "
            f"{directive_ack_due_date(directive)}); ask them, then record it: "
            f"`manage.py providers acknowledge {directive.pk} --reference TEXT` or the admin",
            details={
                "directive": directive.pk,
                "provider": directive.provider.name,
                "contact": directive.provider.contact,
                "sha256": directive.sha256,
            },
        )


@alert_condition("directive_not_written")
def _directive_not_written(now: dt.datetime) -> Iterable[Firing]:
    """A directive's write to its provider's S3 prefix has failed for an hour or more: the
    provider finds nothing there, and the job's tries end after about a day."""
    for directive in directives_not_written(now=now):
        broker_id = directive.broker.broker_id
        yield Firing(
            key=f"directive:{directive.pk}",
            broker_id=broker_id,
            text=f"Directive {directive.pk} to {directive.provider.name} (broker {broker_id}) "
            f"is not written to {directive.provider.s3_prefix}: {directive.delivery_error}; "
            "fix the store or the provider's S3 prefix, then *Write to the provider's S3 "
            "prefix again* on the admin's directives, or hand it over: "
            f"`manage.py drop directive {directive.pk} --out FILE`",
            details={
                "directive": directive.pk,
                "provider": directive.provider.name,
                "error": directive.delivery_error,
            },
        )


# -- canaries: the deletion system tested every cycle
@alert_condition("canary_failed")
def _canary_failed(now: dt.datetime) -> Iterable[Firing]:
    """A canary round failed: a canary's request was answered otherwise than ``deleted``, or
    not within ``DROPPORTAL_CANARY_HOURS``, or could not be sent. It lasts until a later
    round of the broker passes."""
    for result in canary_rounds_failing(now=now):
        canary_round = result.canary_round
        broker_id = canary_round.broker.broker_id
        yield Firing(
            key=f"canary_round:{canary_round.pk}",
            broker_id=broker_id,
            text=f"Canary round {canary_round.pk} of broker {broker_id} (started "
            f"{drop_time_text(canary_round.started_at)}) failed: "
            f"{'; '.join(result.problems)}; the deletion system did not delete its test "
            "consumer: check the target with the broker, then `manage.py drop canary --broker "
            f"{broker_id}` tests it again",
            details={
                "canary_round": canary_round.pk,
                "answer_by": canary_round.answer_by.isoformat(),
                "problems": result.problems,
            },
        )
