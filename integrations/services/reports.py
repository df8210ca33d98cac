"""Reporting statuses to DROP: write response files, upload or amend them, record answers.

Two steps, so that a crash between them can neither lose a status nor send one twice::

    written = report_files_write(broker=broker, actor=actor)    # one transaction per cycle
    run = report_files_upload(broker=broker, actor=actor)       # every WRITTEN file, in order
    report_run(broker=broker, upload=True, actor=actor)         # both: command, job, admin

1. **Write.** Per downloaded list file of a cycle, the reportable work items not yet
   reported go into one ``Id,Status`` file (statuses that changed after they were reported
   into an amendment file). The file (bytes, row count, SHA-256) is stored and its items are
   marked reported (``reported_status_code``, ``reported_at``, ``report_file``) in the same
   transaction as its ledger event. From then on the rows belong to that file: a later run
   never puts them in another one.
2. **Upload.** Each ``written`` (or ``refused``) file is sent as it is stored, oldest cycle
   first, uploads before amendments. DROP's answer is kept on the file and in the ledger:
   ``accepted`` (a name DROP says was already uploaded counts as accepted: that is a retried
   upload that got through before), or ``rejected``, which hands the rows back so the next
   run writes them again under a fresh name (an amendment's rows get back the status DROP
   holds, and the amendment is owed again). An answer about this file alone (a 409, a 400
   without a per-file answer, an answer that does not mention it) makes it ``refused``: it
   is sent again by every run, and holds back nothing else. Only an answer about DROP as a
   whole (401/403, DROP down or throttling past the client's bounded retries, the network)
   stops the run; the files left stay as they are for the next one.
3. **Discard.** Staff give up an amendment DROP refuses or rejected, with a written reason
   (``report_file_discard``): its items keep the status DROP holds.

Manual mode: ``report_file_mark_uploaded`` for files staff uploaded in DROP's portal.
The periodic job calls ``report_auto``: it reports a cycle once every work item has a
status (or when its due date is close), sends amendments, and retries written files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Case, IntegerField, Q, Value, When
from django.utils import timezone

from integrations.drop.calendar import drop_today
from integrations.drop.client import DropApiError, DropClient, UploadResult
from integrations.drop.files import DropFileError
from integrations.drop.reporting import response_name, response_rows, responses_from_rows
from integrations.enqueue import alerts_evaluate_enqueue
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    CycleState,
    DropCycle,
    ReportFile,
    ReportFileState,
    ReportKind,
    WorkItem,
    WorkItemState,
)
from integrations.services.drop import drop_client_for
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append
from integrations.services.work_items import work_items_settle

log = logging.getLogger(__name__)

# A cycle still waiting for some outcomes is reported in part this many days before its due
# date: DROP's penalty runs per request per day late, so the known statuses go out first.
PARTIAL_REPORT_DAYS_BEFORE_DUE = 3

# pg_try_advisory_lock(int, int): purpose and broker pk. One uploader per broker at a time.
_UPLOAD_LOCK = 0x75706C64  # "upld"

# Files DROP has not answered for good: each run sends them, and their rows wait for that
# answer before a changed status is written on top of them.
AWAITING_DROP = (ReportFileState.WRITTEN, ReportFileState.REFUSED)
DISCARD_REASON_MAX = 2000


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


def report_files_write(
    *, broker: Broker, cycle: DropCycle | None = None, actor: str = SYSTEM_ACTOR
) -> list[ReportFile]:
    """Write response files for every reportable work item of ``broker`` (or one cycle).

    One transaction per cycle; a cycle with nothing to report writes nothing.
    """
    if cycle is not None and cycle.broker_id != broker.pk:
        raise ValidationError(f"cycle {cycle.drop_session_id} is not broker {broker.broker_id}'s")
    cycles = [cycle] if cycle is not None else _cycles_with_reportable_items(broker)
    written: list[ReportFile] = []
    for each in cycles:
        written.extend(_cycle_files_write(broker=broker, cycle=each, actor=actor))
    return written


# A changed status of an item whose file DROP has not answered for good waits for that
# answer: accepted, it goes out as an amendment; rejected, the item is released (an upload's
# goes out in a new upload file). An item whose status DROP never accepted is never amended,
# and an amendment is never written on top of one DROP has not taken, so what an amendment
# replaces (``prior_*``) is always what DROP holds.
_AWAITING_ANSWER = Q(needs_amendment=True, report_file__state__in=AWAITING_DROP)


def _cycles_with_reportable_items(broker: Broker) -> list[DropCycle]:
    cycles = []
    for each in DropCycle.objects.filter(broker=broker).order_by("downloaded_at", "pk"):
        # One index probe per cycle on (cycle, state): a broker has a handful of cycles.
        if WorkItem.objects.filter(cycle=each, state=WorkItemState.REPORTABLE).exists():
            cycles.append(each)
    return cycles


def _cycle_files_write(
    *, broker: Broker, cycle: DropCycle, actor: str, amendments_only: bool = False
) -> list[ReportFile]:
    """Every file of one cycle in one transaction and one pass over its work items.

    Marking a million rows is the cost of a report, so it is one ``UPDATE`` for the whole
    cycle: each row gets its file (by list, upload or amendment) and the statement, inside
    ``COPY``, returns the marked rows as CSV sorted by file; each file is cut from exactly
    the rows marked with it (``drop.reporting.responses_from_rows``), without a Python
    loop over the rows.
    """
    with transaction.atomic():
        # Serializes writers of one cycle: the next one sees these rows as reported.
        cycle = DropCycle.objects.select_for_update().get(pk=cycle.pk)
        reportable = WorkItem.objects.filter(
            cycle=cycle, state=WorkItemState.REPORTABLE, status_code__isnull=False
        ).exclude(_AWAITING_ANSWER)
        if amendments_only:
            reportable = reportable.filter(needs_amendment=True)
        groups = list(
            reportable.values_list("file_name", "needs_amendment")
            .distinct()
            .order_by("file_name", "needs_amendment")
        )
        if not groups:
            return []
        taken = set(ReportFile.objects.filter(cycle=cycle).values_list("file_name", flat=True))
        placeholders: dict[tuple[str, bool], ReportFile] = {}
        for list_name, amend in groups:
            kind = ReportKind.AMEND if amend else ReportKind.UPLOAD
            name = response_name(list_name, kind=kind, taken=taken)
            taken.add(name)
            placeholders[(list_name, amend)] = ReportFile.objects.create(
                broker=broker,
                cycle=cycle,
                kind=kind,
                file_name=name,
                rows=0,
                sha256="",
                content=b"",
            )
        return _files_fill(broker=broker, cycle=cycle, placeholders=placeholders, actor=actor)


def _rows_mark(*, cycle: DropCycle, placeholders: dict[tuple[str, bool], ReportFile]) -> bytes:
    """Mark the cycle's reportable rows of the placeholders' groups as reported in their
    file, in one statement; the marked rows as CSV (file id, work item id, status code),
    by file."""
    now = timezone.now()
    which_file = " ".join(
        "WHEN file_name = %s AND needs_amendment = %s THEN %s::bigint" for _ in placeholders
    )
    which_params: list[Any] = []
    for (list_name, amend), report_file in placeholders.items():
        which_params += [list_name, amend, report_file.pk]
    pairs = ", ".join("(%s, %s)" for _ in placeholders)
    pair_params = [value for key in placeholders for value in key]
    # Only placeholders are put into the text; every value is a parameter.
    sql = (
        "COPY (WITH marked AS ("  # noqa: S608
        " UPDATE integrations_workitem"
        f"   SET report_file_id = CASE {which_file} END,"
        "        state = %s, reported_status_code = status_code, reported_at = %s,"
        "        needs_amendment = false, updated_at = %s,"
        # What DROP holds, kept for an amendment (the right-hand sides read the old row).
        "        prior_reported_status_code = CASE WHEN needs_amendment"
        "                                     THEN reported_status_code END,"
        "        prior_reported_at = CASE WHEN needs_amendment THEN reported_at END,"
        "        prior_report_file_id = CASE WHEN needs_amendment THEN report_file_id END"
        "  WHERE cycle_id = %s AND state = %s AND status_code IS NOT NULL"
        "    AND (reported_at IS NULL OR needs_amendment)"
        # Only the groups named above: a row that became reportable meanwhile waits for the
        # next run rather than being marked without a file.
        f"    AND (file_name, needs_amendment) IN ({pairs})"
        # Not on top of a file DROP has not answered for good (_AWAITING_ANSWER).
        "    AND NOT (needs_amendment AND report_file_id IN ("
        "         SELECT id FROM integrations_reportfile WHERE state = ANY(%s)))"
        " RETURNING report_file_id, work_item_id, status_code)"
        " SELECT report_file_id, work_item_id, status_code FROM marked ORDER BY report_file_id"
        ") TO STDOUT WITH (FORMAT csv)"
    )
    params = [
        *which_params,
        WorkItemState.REPORTED,
        now,
        now,
        cycle.pk,
        WorkItemState.REPORTABLE,
        *pair_params,
        list(AWAITING_DROP),
    ]
    data = bytearray()
    with connection.cursor() as cursor:
        # The marked rows come back sorted by file: keep that sort in memory (this
        # transaction only), a million rows are some 25 MB.
        cursor.execute("SET LOCAL work_mem = '64MB'")
        with cursor.copy(sql, params) as copy:
            for block in copy:
                data += block
    return bytes(data)


def _files_fill(
    *,
    broker: Broker,
    cycle: DropCycle,
    placeholders: dict[tuple[str, bool], ReportFile],
    actor: str,
) -> list[ReportFile]:
    """Mark the rows, build each file from its rows, keep the files that got any."""
    by_id = {
        report_file.pk: (list_name, report_file)
        for (list_name, _), report_file in placeholders.items()
    }
    data = _rows_mark(cycle=cycle, placeholders=placeholders)
    names = {file_id: report_file.file_name for file_id, (_, report_file) in by_id.items()}
    try:
        built_files = responses_from_rows(data, names)
    except DropFileError as exc:
        # Rolls the whole cycle back: no row is marked for a file that cannot be written.
        raise ValidationError(f"cannot write a response file: {exc}") from exc
    written = []
    for file_id, (list_name, report_file) in by_id.items():
        built = built_files.get(file_id)
        if built is None:
            report_file.delete()  # its rows were settled elsewhere since they were counted
            continue
        report_file.content = built.content
        report_file.rows = built.rows
        report_file.sha256 = built.sha256
        report_file.save(update_fields=["content", "rows", "sha256"])
        ledger_event_append(
            kind=LedgerKind.REPORT_FILE_WRITTEN,
            broker_id=broker.broker_id,
            subject=report_file.file_name,
            actor=actor,
            data={
                "cycle": cycle.drop_session_id,
                "file_name": report_file.file_name,
                "kind": report_file.kind,
                "list": list_name,
                "rows": built.rows,
                "sha256": built.sha256,
            },
        )
        written.append(report_file)
    return written


# ---------------------------------------------------------------- uploading


def report_client_for(broker: Broker, *, actor: str) -> DropClient:
    """The DROP client for uploads: the pull's client (calls in the ledger), or why not."""
    if not broker.drop_api_key:
        raise ValidationError(
            f"broker {broker.broker_id} has no DROP API key: add it, or upload the files "
            "by hand in DROP's portal and mark them uploaded in the admin"
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
    ``ValidationError`` when the broker has no DROP API key.
    """
    client = client or report_client_for(broker, actor=actor)
    run = ReportRun()
    with _upload_lock(broker):
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
    for each in touched.values():
        cycle_state_refresh(cycle=each, actor=actor)
    return run


@contextlib.contextmanager
def _upload_lock(broker: Broker) -> Iterator[None]:
    """One uploader per broker (session lock: a dead process's connection releases it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_UPLOAD_LOCK, broker.pk])
        if not cursor.fetchone()[0]:
            raise ReportBusy(
                f"another process is uploading broker {broker.broker_id}'s response files; "
                "try again when it is done"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_UPLOAD_LOCK, broker.pk])


def _file_upload(
    *, client: DropClient, report_file: ReportFile, run: ReportRun, actor: str
) -> str | None:
    """Send one file; record DROP's answer. Returns an error that should stop the run."""
    content = bytes(
        ReportFile.objects.filter(pk=report_file.pk).values_list("content", flat=True).get()
    )
    send = client.amend if report_file.kind == ReportKind.AMEND else client.upload
    try:
        result = send([(report_file.file_name, content)])
    except DropApiError as exc:
        if exc.about_this_request:
            _file_refused(report_file=report_file, error=exc, run=run, actor=actor)
            return None
        _file_upload_failed(report_file=report_file, error=exc, actor=actor)
        return f"{report_file.file_name}: {exc}"
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
        locked.drop_response = {
            "endpoint": f"/data/{report_file.kind}",
            "status": error.status,
            "message": message,
            "refused_at": now if news else previous.get("refused_at", now),
            "last_attempt_at": now,
            "refusals": int(previous.get("refusals", 0)) + 1,
        }
        locked.save(update_fields=["state", "drop_response"])
        if news:
            ledger_event_append(
                kind=LedgerKind.REPORT_FILE_REFUSED,
                broker_id=report_file.broker.broker_id,
                subject=report_file.file_name,
                actor=actor,
                data={
                    "cycle": report_file.cycle.drop_session_id,
                    "file_name": report_file.file_name,
                    "kind": report_file.kind,
                    "rows": report_file.rows,
                    "sha256": report_file.sha256,
                    "status": error.status,
                    "message": message,
                },
            )
            alerts_evaluate_enqueue()
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
        else:
            answer["rows_released"] = _rows_release(locked)
        locked.state = state
        locked.drop_response = answer
        locked.save(update_fields=["state", "drop_response", "uploaded_at"])
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
                "cycle": report_file.cycle.drop_session_id,
                "file_name": name,
                "kind": report_file.kind,
                "rows": report_file.rows,
                "sha256": report_file.sha256,
                "drop_response": answer,
            },
        )
        if state == ReportFileState.REJECTED:
            alerts_evaluate_enqueue()  # the cycle waits for staff: tell them now
    (run.accepted if state == ReportFileState.ACCEPTED else run.rejected).append(locked)
    return None


def _rows_release(report_file: ReportFile) -> int:
    """DROP rejected the file: its rows are owed again (written anew by the next run).

    An upload's rows go back to "never reported". An amendment's rows get back what DROP
    holds (``_prior_restore``) and are amended again if their status still differs.
    """
    if report_file.kind == ReportKind.AMEND:
        return _prior_restore(report_file=report_file, give_up=False)
    reopened_state = Case(
        When(status_code__isnull=True, then=Value(WorkItemState.OPEN)),
        default=Value(WorkItemState.REPORTABLE),
    )
    return WorkItem.objects.filter(report_file=report_file).update(
        state=reopened_state,
        reported_status_code=None,
        reported_at=None,
        report_file=None,
        needs_amendment=False,
        updated_at=timezone.now(),
    )


# The rows of an amendment DROP did not take get back what DROP holds: the status, time and
# file they had before it (``prior_*``). Their state and amendment flag then follow from
# that as when settling (one rule, in work_item_settle.sql): an amendment is owed again
# while their status differs. With ``give_up`` (staff discarded the amendment), a row
# whose status is still the one the amendment carried (state ``reported``) is owed nothing.
# A row marked before ``prior_*`` existed (migration 0016) keeps the old fallback: no code
# DROP holds is known, so it is amended again.
_PRIOR_RESTORE = """
UPDATE integrations_workitem w
SET reported_status_code = CASE WHEN w.prior_reported_at IS NULL THEN NULL
                                ELSE w.prior_reported_status_code END,
    reported_at = coalesce(w.prior_reported_at, w.reported_at),
    report_file_id = CASE WHEN w.prior_reported_at IS NULL THEN w.report_file_id
                          ELSE w.prior_report_file_id END,
    prior_reported_status_code = NULL, prior_reported_at = NULL, prior_report_file_id = NULL,
    (state, needs_amendment) = (
        SELECT CASE WHEN w.state = %(removed)s THEN w.state
                    WHEN %(give_up)s AND w.state = %(reported)s
                         AND w.prior_reported_at IS NOT NULL THEN w.state
                    ELSE f.state END,
               CASE WHEN w.state = %(removed)s OR (%(give_up)s AND w.state = %(reported)s
                                                  AND w.prior_reported_at IS NOT NULL)
                    THEN false ELSE f.needs_amendment END
        FROM dropportal_work_item_status_fields(
            w.status_code, w.prior_reported_at,
            CASE WHEN w.prior_reported_at IS NULL THEN NULL
                 ELSE w.prior_reported_status_code END,
            true) f
    ),
    updated_at = %(now)s
WHERE w.cycle_id = %(cycle)s AND w.report_file_id = %(file)s
"""


def _prior_restore(*, report_file: ReportFile, give_up: bool) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            _PRIOR_RESTORE,
            {
                "removed": WorkItemState.REMOVED,
                "reported": WorkItemState.REPORTED,
                "give_up": give_up,
                "now": timezone.now(),
                "cycle": report_file.cycle_id,
                "file": report_file.pk,
            },
        )
        return cursor.rowcount


# A rejected amendment's rows were handed back when DROP answered: those still owing the
# very status it carried, and in no later file, owe nothing once staff give it up.
_REJECTED_GIVE_UP = """
UPDATE integrations_workitem w
SET state = %(reported)s, needs_amendment = false, updated_at = %(now)s
FROM unnest(%(ids)s::text[], %(codes)s::integer[]) AS a(work_item_id, status_code)
WHERE w.cycle_id = %(cycle)s AND w.work_item_id = a.work_item_id
  AND w.state = %(reportable)s AND w.needs_amendment AND w.status_code = a.status_code
  AND w.reported_status_code IS NOT NULL AND w.report_file_id < %(file)s
"""


def report_file_discard(*, report_file: ReportFile, reason: str, actor: str) -> ReportFile:
    """Staff give up an amendment DROP refuses (or rejected), with a written reason.

    Its work items keep the status DROP holds (the one before the amendment) and owe DROP
    nothing more, unless their status changed again since. The file stays, ``discarded``,
    with the reason, who and when; one ``report_file.discarded`` ledger event. An upload
    cannot be discarded: its statuses are owed to DROP.

    Raises ``ReportBusy`` while the broker's files are being uploaded: DROP could take this
    very file while staff give it up.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": "write why this amendment is given up"})
    if len(reason) > DISCARD_REASON_MAX:
        raise ValidationError({"reason": f"at most {DISCARD_REASON_MAX} characters"})
    broker = Broker.objects.get(pk=report_file.broker_id)
    with _upload_lock(broker):
        discarded = _report_file_discard(report_file=report_file, reason=reason, actor=actor)
    cycle_state_refresh(cycle=discarded.cycle, actor=actor)
    return discarded


def _report_file_discard(*, report_file: ReportFile, reason: str, actor: str) -> ReportFile:
    with transaction.atomic():
        locked = (
            ReportFile.objects.select_for_update(of=("self",))
            .select_related("broker", "cycle")
            .get(pk=report_file.pk)
        )
        if locked.kind != ReportKind.AMEND:
            raise ValidationError(
                f"{locked.file_name} is an upload: only an amendment can be discarded (the "
                "statuses of an upload are owed to DROP)"
            )
        if locked.state not in (ReportFileState.REFUSED, ReportFileState.REJECTED):
            raise ValidationError(
                f"{locked.file_name} is {locked.get_state_display().lower()}: only an "
                "amendment DROP refused or rejected can be discarded"
            )
        previous_state = locked.state
        if previous_state == ReportFileState.REFUSED:
            kept = _prior_restore(report_file=locked, give_up=True)
        else:
            rows = response_rows(bytes(locked.content))
            with connection.cursor() as cursor:
                cursor.execute(
                    _REJECTED_GIVE_UP,
                    {
                        "reported": WorkItemState.REPORTED,
                        "reportable": WorkItemState.REPORTABLE,
                        "now": timezone.now(),
                        "ids": [work_item_id for work_item_id, _ in rows],
                        "codes": [code for _, code in rows],
                        "cycle": locked.cycle_id,
                        "file": locked.pk,
                    },
                )
                kept = cursor.rowcount
        locked.state = ReportFileState.DISCARDED
        locked.discard_reason = reason
        locked.discarded_by = actor
        locked.discarded_at = timezone.now()
        locked.save(update_fields=["state", "discard_reason", "discarded_by", "discarded_at"])
        ledger_event_append(
            kind=LedgerKind.REPORT_FILE_DISCARDED,
            broker_id=locked.broker.broker_id,
            subject=locked.file_name,
            actor=actor,
            data={
                "cycle": locked.cycle.drop_session_id,
                "file_name": locked.file_name,
                "kind": locked.kind,
                "rows": locked.rows,
                "sha256": locked.sha256,
                "previous_state": previous_state,
                "drop_message": locked.drop_response.get("message")
                or locked.drop_response.get("reason", ""),
                "reason": reason,
                "work_items_kept": kept,
            },
        )
        alerts_evaluate_enqueue()  # its alert clears now rather than at the next run
    return locked


def report_file_mark_uploaded(*, report_file: ReportFile, actor: str) -> ReportFile:
    """Staff uploaded the file by hand in DROP's portal (manual mode)."""
    with transaction.atomic():
        locked = (
            ReportFile.objects.select_for_update(of=("self",))
            .select_related("broker", "cycle")
            .defer("content")
            .get(pk=report_file.pk)
        )
        if locked.state not in AWAITING_DROP:
            raise ValidationError(
                f"{locked.file_name} is {locked.get_state_display().lower()}: only a written "
                "or refused file can be marked uploaded"
            )
        locked.state = ReportFileState.MANUAL
        locked.uploaded_at = timezone.now()
        locked.save(update_fields=["state", "uploaded_at"])
        ledger_event_append(
            kind=LedgerKind.REPORT_FILE_MARKED_UPLOADED,
            broker_id=locked.broker.broker_id,
            subject=locked.file_name,
            actor=actor,
            data={
                "cycle": locked.cycle.drop_session_id,
                "file_name": locked.file_name,
                "kind": locked.kind,
                "rows": locked.rows,
                "sha256": locked.sha256,
            },
        )
    cycle_state_refresh(cycle=locked.cycle, actor=actor)
    return locked


def cycle_state_refresh(*, cycle: DropCycle, actor: str = SYSTEM_ACTOR) -> DropCycle:
    """An open cycle becomes ``reported`` once every work item owed a status was reported
    and DROP has every file (none still written or refused)."""
    with transaction.atomic():
        locked = DropCycle.objects.select_for_update(of=("self",)).select_related("broker")
        current = locked.get(pk=cycle.pk)
        if current.state != CycleState.OPEN:
            return current
        unreported = WorkItem.objects.filter(
            cycle=current,
            state__in=[WorkItemState.OPEN, WorkItemState.REPORTABLE],
            reported_at__isnull=True,
        ).exists()
        if unreported or current.report_files.filter(state__in=AWAITING_DROP).exists():
            return current
        current.state = CycleState.REPORTED
        current.save(update_fields=["state"])
        ledger_event_append(
            kind=LedgerKind.DROP_CYCLE_REPORTED,
            broker_id=current.broker.broker_id,
            subject=current.drop_session_id,
            actor=actor,
            data={"cycle": current.drop_session_id, "due_date": current.due_date.isoformat()},
        )
    cycle.state = current.state
    return current


# ---------------------------------------------------------------- running


def report_run(
    *,
    broker: Broker,
    upload: bool,
    cycle: DropCycle | None = None,
    client: DropClient | None = None,
    actor: str = SYSTEM_ACTOR,
) -> ReportRun:
    """Write what is reportable, then (``upload``) send every written file."""
    if upload:
        client = client or report_client_for(broker, actor=actor)  # no key: refuse first
    written = report_files_write(broker=broker, cycle=cycle, actor=actor)
    if not upload:
        return ReportRun(written=written, pending=_still_written(broker, cycle))
    run = report_files_upload(broker=broker, cycle=cycle, client=client, actor=actor)
    run.written = _refreshed(written)
    return run


def _refreshed(files: list[ReportFile]) -> list[ReportFile]:
    """The same files with their state and DROP's answer as they are now."""
    current = {
        pk: (state, answer, uploaded_at)
        for pk, state, answer, uploaded_at in ReportFile.objects.filter(
            pk__in=[f.pk for f in files]
        ).values_list("pk", "state", "drop_response", "uploaded_at")
    }
    for report_file in files:
        report_file.state, report_file.drop_response, report_file.uploaded_at = current[
            report_file.pk
        ]
    return files


def _still_written(broker: Broker, cycle: DropCycle | None) -> list[ReportFile]:
    files = ReportFile.objects.filter(broker=broker, state__in=AWAITING_DROP)
    if cycle is not None:
        files = files.filter(cycle=cycle)
    return list(files.select_related("cycle").order_by("pk"))


def auto_report_brokers() -> list[Broker]:
    """Brokers the periodic job reports for: those with a DROP API key (unless turned off)."""
    if not settings.DROPPORTAL_AUTO_REPORT:
        return []
    # The key is encrypted, so "has a key" is read in Python; brokers are few.
    return [broker for broker in Broker.objects.order_by("pk") if broker.drop_api_key]


def report_auto(
    *, broker: Broker, client: DropClient | None = None, today: dt.date | None = None
) -> ReportRun:
    """The periodic job's work for one broker.

    - Settle open work items whose outcomes all arrived (a safety net).
    - Write files for each cycle whose every work item has a status, or whose due date is
      ``PARTIAL_REPORT_DAYS_BEFORE_DUE`` days away or past; write amendments for any cycle.
      A cycle whose latest file DROP rejected waits for staff (no new file every run).
    - Upload every written file.
    """
    today = today or drop_today()
    client = client or report_client_for(broker, actor=SYSTEM_ACTOR)
    written: list[ReportFile] = []
    for cycle in _cycles_with_work(broker):
        if cycle.state == CycleState.OPEN:
            work_items_settle(cycle=cycle)
        latest = cycle.report_files.order_by("-pk").only("state").first()
        if latest is not None and latest.state == ReportFileState.REJECTED:
            log.warning("%s: the last response file was rejected; waiting for staff", cycle)
            continue
        complete = not WorkItem.objects.filter(
            cycle=cycle, state=WorkItemState.OPEN, reported_at__isnull=True
        ).exists()
        near_due = cycle.due_date - today <= dt.timedelta(days=PARTIAL_REPORT_DAYS_BEFORE_DUE)
        if complete or near_due:
            written.extend(report_files_write(broker=broker, cycle=cycle))
        else:
            written.extend(
                _cycle_files_write(
                    broker=broker, cycle=cycle, actor=SYSTEM_ACTOR, amendments_only=True
                )
            )
    run = report_files_upload(broker=broker, client=client)
    run.written = _refreshed(written)
    return run


def _cycles_with_work(broker: Broker) -> Sequence[DropCycle]:
    """Open cycles, and reported ones with a status to amend."""
    cycles = []
    for cycle in DropCycle.objects.filter(broker=broker).order_by("downloaded_at", "pk"):
        if (
            cycle.state == CycleState.OPEN
            or WorkItem.objects.filter(
                cycle=cycle, state=WorkItemState.REPORTABLE, needs_amendment=True
            ).exists()
        ):
            cycles.append(cycle)
    return cycles
