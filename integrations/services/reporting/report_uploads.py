"""Uploading response files to DROP and recording its answers: the second step of reporting.

Each ``written`` (or ``refused``) file is sent as it is stored, oldest cycle first, uploads
before amendments. DROP's answer is kept on the file and in the ledger: ``accepted`` (a name
DROP says was already uploaded counts as accepted: that is a retried upload that got through
before), and only then does DROP hold the file's statuses (``reported_status_code``,
``reported_at`` and ``report_file`` of its rows, the status written into it); or
``rejected``: DROP holds nothing new, and the rows are owed again, written anew under a
fresh name when staff run the report (the periodic job leaves them to staff, and goes on
with the cycle's other statuses). An answer about this file alone (a 409, a 400 without a
per-file answer, an answer that does not mention it) makes it ``refused``: it is sent again
by every run, and holds back nothing else. Only an answer about DROP as a whole (401/403,
DROP down or throttling past the client's bounded retries, the network) stops the run; the
files left stay as they are.

A file is marked being sent (``sending_since``, committed) before the call and unmarked
with DROP's answer: DROP may notify about it before that answer is recorded, and such a
notification waits for it rather than going to an earlier file
(``services.cycle.drop_notifications``)::

    run = report_files_upload(broker=broker, actor=actor)   # every WRITTEN file, in order
    run.accepted, run.rejected, run.refused, run.error
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Case, Exists, IntegerField, OuterRef, Value, When
from django.utils import timezone

from integrations.drop.client import DropApiError, DropAuthError, DropClient, UploadResult
from integrations.enqueue import alerts_evaluate_enqueue
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    AWAITING_DROP,
    Broker,
    CycleState,
    DropCycle,
    ReportFile,
    ReportFileState,
    ReportKind,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle.cycle_state import cycle_state_refresh
from integrations.services.cycle.drop import broker_drop_settings_problem, drop_client_for
from integrations.services.cycle.drop_access import drop_access_record
from integrations.services.cycle.drop_notifications import drop_notifications_attach_awaiting
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append
from integrations.services.locks import advisory_session_lock
from integrations.services.reporting.report_files import (
    report_file_facts,
)

log = logging.getLogger(__name__)

# pg_try_advisory_lock(int, int): purpose and broker pk. One uploader per broker at a time.
_UPLOAD_LOCK = 0x75706C64  # "upld"


class ReportBusy(Exception):
    """Another process is uploading this broker's files right now."""


@dataclass
class ReportRun:
    """What one report run did; ``error`` is why it stopped early (files stay written)."""

    written: list[ReportFile] = field(default_factory=list)
    accepted: list[ReportFile] = field(default_factory=list)
    rejected: list[ReportFile] = field(default_factory=list)
    refused: list[ReportFile] = field(default_factory=list)  # refused alone; sent again later
    pending: list[ReportFile] = field(default_factory=list)  # still to send after the run
    error: str | None = None


# ---------------------------------------------------------------- writing


def report_client_for(broker: Broker, *, actor: str) -> DropClient:
    """The DROP client for uploads: the pull's client (calls in the ledger), or why not
    (``ValidationError``: no key, or a key or base URL the client refuses)."""
    if not broker.drop_api_key:
        raise ValidationError(
            f"broker {broker.broker_id} has no DROP API key: add it, or upload the files "
            "by hand in DROP's portal and mark them uploaded in the admin"
        )
    problem = broker_drop_settings_problem(broker)
    if problem:
        raise ValidationError(
            f"broker {broker.broker_id} cannot reach DROP: {problem}; enter it again in the admin"
        )
    return drop_client_for(broker, actor=actor)


def report_files_upload(
    *,
    broker: Broker,
    cycle: DropCycle | None = None,
    client: DropClient | None = None,
    actor: str = SYSTEM_ACTOR,
) -> ReportRun:
    """Send every written or refused file of ``broker`` (or one cycle) to DROP and record
    the answers. A file DROP refuses on its own holds back no other; an answer about DROP
    as a whole stops the run (``ReportRun.error``).

    Raises ``ReportBusy`` when another process is uploading for the broker, and
    ``ValidationError`` when the broker has no DROP API key, or one DROP's client refuses.
    """
    client = client or report_client_for(broker, actor=actor)
    run = ReportRun()
    with report_upload_lock(broker):
        files = ReportFile.objects.filter(broker=broker, state__in=AWAITING_DROP)
        if cycle is not None:
            files = files.filter(cycle=cycle)
        ordered = files.select_related("broker", "cycle").order_by(
            "cycle__downloaded_at",
            "cycle_id",
            Case(
                When(kind=ReportKind.UPLOAD, then=Value(0)), default=1, output_field=IntegerField()
            ),
            "pk",
        )
        queue = list(ordered.defer("content"))
        touched: dict[int, DropCycle] = {}
        for position, report_file in enumerate(queue):
            touched[report_file.cycle_id] = report_file.cycle
            error = _file_upload(client=client, report_file=report_file, run=run, actor=actor)
            if error is not None:
                # DROP is down, throttling past our patience, or refusing the broker: the
                # rest would meet the same answer. They stay written for the next run.
                run.error = error
                run.pending.extend(queue[position:])
                break
    # The open cycles a stopped run can leave behind too, not only those whose files went
    # out: a run stopped after DROP's last answer was recorded (killed, the database gone)
    # left its cycle open with files, none of them still waiting for DROP, so nothing of it
    # is sent again. Only those: a refresh locks the cycle and may read all its work items.
    still_open = (
        DropCycle.objects.filter(broker=broker, state=CycleState.OPEN)
        .filter(Exists(ReportFile.objects.filter(cycle=OuterRef("pk"))))
        .exclude(Exists(ReportFile.objects.filter(cycle=OuterRef("pk"), state__in=AWAITING_DROP)))
    )
    if cycle is not None:
        still_open = still_open.filter(pk=cycle.pk)
    for each in [*touched.values(), *still_open.exclude(pk__in=touched).order_by("pk")]:
        cycle_state_refresh(cycle=each, actor=actor)
    return run


@contextlib.contextmanager
def report_upload_lock(broker: Broker) -> Iterator[None]:
    """One uploader per broker (session lock: a dead process's connection releases it)."""
    with advisory_session_lock(
        purpose=_UPLOAD_LOCK,
        key=broker.pk,
        busy=lambda: ReportBusy(
            f"another process is uploading broker {broker.broker_id}'s response files; "
            "try again when it is done"
        ),
    ):
        yield


def _file_upload(
    *, client: DropClient, report_file: ReportFile, run: ReportRun, actor: str
) -> str | None:
    """Send one file; record DROP's answer. Returns an error that should stop the run."""
    content = bytes(
        ReportFile.objects.filter(pk=report_file.pk).values_list("content", flat=True).get()
    )
    send = client.amend if report_file.kind == ReportKind.AMEND else client.upload
    broker = report_file.broker
    # Committed before DROP can answer, so a notification about this file that comes before
    # its answer is recorded waits for it. Left set if the call fails: DROP may hold the file.
    marked = ReportFile.objects.filter(pk=report_file.pk, state__in=AWAITING_DROP).update(
        sending_since=timezone.now()
    )
    if not marked:
        return None  # no longer DROP's to take since the run read it: marked uploaded, or held
    try:
        result = send([(report_file.file_name, content)])
    except DropApiError as exc:
        # DROP access: an outage starts or goes on, or DROP answered and one ends.
        drop_access_record(broker=broker, actor=actor, error=exc)
        if exc.about_this_request:
            _file_refused(report_file=report_file, error=exc, run=run, actor=actor)
            return None
        _file_upload_failed(report_file=report_file, error=exc, actor=actor)
        return f"{report_file.file_name}: {exc}"
    drop_access_record(broker=broker, actor=actor)
    return _file_answer_record(report_file=report_file, result=result, run=run, actor=actor)


def _file_upload_failed(*, report_file: ReportFile, error: DropApiError, actor: str) -> None:
    """Keep the file as it is (written or refused); note the failure (a ledger event when
    the error is new)."""
    message = str(error)
    with transaction.atomic():
        locked = ReportFile.objects.select_for_update().defer("content").get(pk=report_file.pk)
        if locked.state not in AWAITING_DROP:
            return
        previous = locked.drop_response.get("last_error")
        locked.drop_response = {
            **locked.drop_response,
            "last_error": message,
            "last_status": error.status,
            "last_attempt_at": timezone.now().isoformat(),
            "failures": int(locked.drop_response.get("failures", 0)) + 1,
        }
        locked.save(update_fields=["drop_response"])
        # Retried every run while DROP is down: one event per distinct error, not per try.
        if message != previous:
            ledger_event_append(
                kind=LedgerKind.REPORT_FILE_UPLOAD_FAILED,
                broker_id=report_file.broker.broker_id,
                subject=report_file.file_name,
                actor=actor,
                data={
                    "cycle": report_file.cycle.drop_session_id,
                    "file_name": report_file.file_name,
                    "kind": report_file.kind,
                    "error": message,
                    "status": error.status,
                    "error_type": type(error).__name__,
                },
            )
            if isinstance(error, DropAuthError):
                alerts_evaluate_enqueue()  # every upload waits on the broker: tell staff now
    log.warning("DROP %s of %s failed: %s", report_file.kind, report_file.file_name, message)


def _file_refused(
    *, report_file: ReportFile, error: DropApiError, run: ReportRun, actor: str
) -> None:
    """DROP refused this file alone: it becomes ``refused`` with DROP's message, staff hear
    of it at once (a ledger event and an alert evaluation when the refusal is new), and the
    next run sends it again (DROP's state may change, such as a download it now amends)."""
    message = str(error)
    now = timezone.now().isoformat()
    with transaction.atomic():
        locked = ReportFile.objects.select_for_update().defer("content").get(pk=report_file.pk)
        if locked.state not in AWAITING_DROP:
            return  # staff marked it uploaded meanwhile: their record stands
        news = locked.state != ReportFileState.REFUSED or (
            locked.drop_response.get("message") != message
        )
        previous = locked.drop_response if locked.state == ReportFileState.REFUSED else {}
        locked.state = ReportFileState.REFUSED
        locked.sending_since = None
        locked.drop_response = {
            "endpoint": f"/data/{report_file.kind}",
            "status": error.status,
            "message": message,
            "refused_at": now if news else previous.get("refused_at", now),
            "last_attempt_at": now,
            "refusals": int(previous.get("refusals", 0)) + 1,
        }
        locked.save(update_fields=["state", "sending_since", "drop_response"])
        if news:
            ledger_event_append(
                kind=LedgerKind.REPORT_FILE_REFUSED,
                broker_id=report_file.broker.broker_id,
                subject=report_file.file_name,
                actor=actor,
                data={
                    **report_file_facts(report_file),
                    "status": error.status,
                    "message": message,
                },
            )
            alerts_evaluate_enqueue()
        drop_notifications_attach_awaiting(
            broker=report_file.broker, kind=report_file.kind, actor=actor
        )
    log.warning("DROP refused %s %s: %s", report_file.kind, report_file.file_name, message)
    run.refused.append(locked)


def _file_answer_record(
    *, report_file: ReportFile, result: UploadResult, run: ReportRun, actor: str
) -> str | None:
    name = report_file.file_name
    answer: dict[str, Any] = {
        "endpoint": f"/data/{report_file.kind}",
        "status": result.status,
        "message": result.message,
        "attempts": result.attempts,
        "answered_at": timezone.now().isoformat(),
    }
    if name in result.accepted_names:
        answer["already_uploaded"] = name in result.already_uploaded_names
        if name in result.newly_accepted:
            answer["file_size_bytes"] = result.newly_accepted[name]
        state = ReportFileState.ACCEPTED
    elif name in result.rejected:
        answer["reason"] = result.rejected[name]
        state = ReportFileState.REJECTED
    else:
        error = DropApiError(
            f"DROP's answer does not mention {name}: {result.message}", status=result.status
        )
        _file_refused(report_file=report_file, error=error, run=run, actor=actor)
        return None
    with transaction.atomic():
        locked = ReportFile.objects.select_for_update().defer("content").get(pk=report_file.pk)
        if locked.state not in AWAITING_DROP:
            return None  # staff marked it uploaded meanwhile: their record stands
        if state == ReportFileState.ACCEPTED:
            locked.uploaded_at = timezone.now()
            report_rows_taken(report_file=locked, at=locked.uploaded_at)
        else:
            answer["rows_owed_again"] = _rows_owed_again(locked)
        locked.state = state
        locked.sending_since = None
        locked.drop_response = answer
        locked.save(update_fields=["state", "sending_since", "drop_response", "uploaded_at"])
        ledger_event_append(
            kind=(
                LedgerKind.REPORT_FILE_ACCEPTED
                if state == ReportFileState.ACCEPTED
                else LedgerKind.REPORT_FILE_REJECTED
            ),
            broker_id=report_file.broker.broker_id,
            subject=name,
            actor=actor,
            data={
                **report_file_facts(report_file),
                "drop_response": answer,
            },
        )
        if state == ReportFileState.REJECTED:
            alerts_evaluate_enqueue()  # its rows wait for staff: tell them now
        drop_notifications_attach_awaiting(
            broker=report_file.broker, kind=report_file.kind, actor=actor
        )
    (run.accepted if state == ReportFileState.ACCEPTED else run.rejected).append(locked)
    return None


def _rows_owed_again(report_file: ReportFile) -> int:
    """DROP rejected the file: it holds nothing new, so the rows keep what DROP holds (never
    reported, or the status before the amendment) and stay with the file
    (``pending_report_file``), owed again. They are written anew when staff run the report
    (``retry_rejected``); a removed item stays removed and owed nothing. How many are owed
    again."""
    return (
        WorkItem.objects.filter(cycle_id=report_file.cycle_id, pending_report_file=report_file)
        .exclude(state=WorkItemState.REMOVED)
        .count()
    )


# DROP took the file: its rows now hold the status written into it (pending_status_code,
# not the one they have now, which may have changed since), and their state and amendment
# flag follow from that as when settling (one rule, in work_item_settle.sql): a status that
# changed since is amended, a removed item stays removed. While an item waits for an
# outcome (a late match), the flag marks that DROP holds a status for it. (The right-hand
# sides read the row as it was.) first_reported_at is set once, by the first file DROP
# takes (a row reported before the column existed keeps its reported_at as the first).
_ROWS_TAKEN = """
UPDATE integrations_workitem w
SET reported_status_code = w.pending_status_code, reported_at = %(at)s,
    first_reported_at = coalesce(w.first_reported_at, w.reported_at, %(at)s),
    report_file_id = w.pending_report_file_id,
    pending_report_file_id = NULL, pending_status_code = NULL,
    (state, needs_amendment) = (
        SELECT f.state, f.needs_amendment FROM dropportal_work_item_status_fields(
            p_state => w.state, p_code => w.status_code, p_reported_at => %(at)s,
            p_reported_code => w.pending_status_code, p_needs_amendment => true) f
    ),
    updated_at = %(at)s
WHERE w.cycle_id = %(cycle)s AND w.pending_report_file_id = %(file)s
"""


# Its cycle's row first (``matching_lock``: a cycle before its work items): an import
# closing the items DROP removed locks the open cycles before them, so the two take the
# rows one after the other. The rows themselves go in the order the update's plan reads
# them, not by id: a lock pass over a file's rows costs half the marking again
# (docs/benchmarks.md, reporting).
_CYCLE_LOCKED = "SELECT 1 FROM integrations_dropcycle WHERE id = %(cycle)s FOR KEY SHARE"


def report_rows_taken(*, report_file: ReportFile, at: dt.datetime) -> int:
    """DROP holds ``report_file``'s statuses since ``at`` (accepted, or uploaded by hand)."""
    with connection.cursor() as cursor:
        cursor.execute(_CYCLE_LOCKED, {"cycle": report_file.cycle_id})
        cursor.execute(
            _ROWS_TAKEN,
            {
                "at": at,
                "cycle": report_file.cycle_id,
                "file": report_file.pk,
            },
        )
        return cursor.rowcount
