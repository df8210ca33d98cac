"""Writing response files: the first step of reporting, one transaction per cycle.

Per downloaded list file of a cycle, the reportable work items in no file DROP still has to
answer go into one ``Id,Status`` file (statuses that differ from the one DROP holds into an
amendment file). The file (bytes, row count, SHA-256) is stored and its items point at it
(``pending_report_file``) in the same transaction as its ledger event. From then on the
rows belong to that file until DROP answers it: a later run never puts them in another one.
What DROP holds (``reported_status_code``, ``reported_at``, ``report_file``) changes only
when DROP accepts the file (``report_uploads``) or staff mark it uploaded by hand
(``report_manual``)::

    written = report_files_write(broker=broker, actor=actor)
    cycle_state_refresh(cycle=cycle, actor=actor)   # services.cycle.cycle_state: "reported" once
                                                    # DROP has every file

Sending them is ``services.reporting.report_uploads``; the whole run is
``services.reporting.reports``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from integrations.drop.files import DropFileError, parse_file_name
from integrations.drop.reporting import (
    response_name,
    response_status_counts,
    responses_from_rows,
)
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    NOT_YET_TAKEN,
    Broker,
    DropCycle,
    ReportFile,
    ReportFileState,
    ReportKind,
    WorkItem,
    WorkItemQuerySet,
)
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append
from integrations.services.locks import advisory_xact_lock

_NAMES_LOCK = 0x6E616D65  # "name": the first key of the lock on a broker's file names


def report_files_write(
    *,
    broker: Broker,
    cycle: DropCycle | None = None,
    actor: str = SYSTEM_ACTOR,
    amendments_only: bool = False,
    retry_rejected: bool = True,
) -> list[ReportFile]:
    """Write response files for every reportable work item of ``broker`` (or one cycle;
    with ``amendments_only``, only the changed statuses of items DROP holds a status for;
    without ``retry_rejected``, not the rows of a file DROP rejected).

    One transaction per cycle; a cycle with nothing to report writes nothing.
    """
    if cycle is not None and cycle.broker_id != broker.pk:
        raise ValidationError(f"cycle {cycle.drop_session_id} is not broker {broker.broker_id}'s")
    cycles = [cycle] if cycle is not None else _cycles_with_reportable_items(broker)
    written: list[ReportFile] = []
    for each in cycles:
        written.extend(
            _cycle_files_write(
                broker=broker,
                cycle=each,
                actor=actor,
                amendments_only=amendments_only,
                retry_rejected=retry_rejected,
            )
        )
    return written


def _kept_back(retry_rejected: bool) -> list[ReportFileState]:
    """The states of an item's ``pending_report_file`` that keep it out of a new file.

    An item in a file DROP has not answered for good (``AWAITING_DROP``), or that waits
    for approval (``NOT_YET_TAKEN``), waits for that answer, whatever its status does
    meanwhile: accepted, DROP holds the file's status and a different one goes out as an
    amendment; not approved, the item is free again; rejected, the item goes out again in a new file
    (an upload while DROP holds nothing for it, an amendment otherwise). So an item is never
    in two files DROP may both take, and an amendment always replaces what DROP holds.
    Without ``retry_rejected`` (the periodic job), the rows of a file DROP rejected are left
    to staff rather than written into a new file every run; ``drop report`` writes them.
    """
    return [*NOT_YET_TAKEN, *([] if retry_rejected else [ReportFileState.REJECTED])]


def _cycles_with_reportable_items(broker: Broker) -> list[DropCycle]:
    cycles = []
    marked = DropCycle.objects.filter(broker=broker).may_have_outstanding()
    for each in marked.order_by("downloaded_at", "pk"):
        if WorkItem.objects.reportable().filter(cycle=each).exists():
            cycles.append(each)
    return cycles


def _cycle_files_write(
    *,
    broker: Broker,
    cycle: DropCycle,
    actor: str,
    amendments_only: bool = False,
    retry_rejected: bool = True,
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
        kept_back = _kept_back(retry_rejected)
        reportable = _to_write(cycle, amendments_only=amendments_only).exclude(
            pending_report_file__state__in=kept_back
        )
        groups = list(
            reportable.values_list("file_name", "needs_amendment")
            .distinct()
            .order_by("file_name", "needs_amendment")
        )
        if not groups:
            return []
        # Names are the broker's, not the cycle's: two cycles downloaded on one date name
        # their lists alike, and an amendment of the first sent during the second's download
        # would take the second's name (DROP refuses a repeat, and a repeat counts as taken).
        # Writers of the broker's other cycles wait here, so two never pick one name.
        with connection.cursor() as cursor:
            advisory_xact_lock(cursor, purpose=_NAMES_LOCK, key=broker.pk)
        taken = set(ReportFile.objects.filter(broker=broker).values_list("file_name", flat=True))
        # Read under the cycle's lock, and share-locked until this run commits: turning the
        # setting on (``broker_update`` locks the row) waits for it, then holds its files.
        # A key share: the pulls' updates of the row are not held up.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT approve_uploads FROM integrations_broker WHERE id = %s FOR KEY SHARE",
                [broker.pk],
            )
            approve = bool(cursor.fetchone()[0])
        state = ReportFileState.AWAITING_APPROVAL if approve else ReportFileState.WRITTEN
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
                state=state,
                written_by=actor,
            )
        return _files_fill(
            broker=broker, cycle=cycle, placeholders=placeholders, kept_back=kept_back, actor=actor
        )


def _to_write(cycle: DropCycle, *, amendments_only: bool = False) -> WorkItemQuerySet:
    """The cycle's work items with a status to write to DROP (``reportable()``, or with
    ``amendments_only`` ``awaiting_amendment()``), each with its code: the groups counted
    and the rows marked (``_rows_mark``) are the same rows."""
    items = (
        WorkItem.objects.awaiting_amendment() if amendments_only else WorkItem.objects.reportable()
    )
    return items.filter(cycle=cycle, status_code__isnull=False)


def _rows_mark(
    *,
    cycle: DropCycle,
    placeholders: dict[tuple[str, bool], ReportFile],
    kept_back: list[ReportFileState],
) -> bytes:
    """Put the cycle's reportable rows of the placeholders' groups in their file, in one
    statement; the marked rows as CSV (file id, work item id, status code), by file."""
    now = timezone.now()
    which_file = " ".join(
        "WHEN file_name = %s AND needs_amendment = %s THEN %s::bigint" for _ in placeholders
    )
    which_params: list[Any] = []
    for (list_name, amend), report_file in placeholders.items():
        which_params += [list_name, amend, report_file.pk]
    pairs = ", ".join("(%s, %s)" for _ in placeholders)
    pair_params = [value for key in placeholders for value in key]
    # The rows to write, as ``_to_write`` selects them (its compiled filter, not restated);
    # an amendment only run is narrowed by its groups (all flagged).
    to_write, to_write_params = _to_write(cycle).where_sql()
    # Only placeholders are put into the text; every value is a parameter.
    sql = (
        "COPY (WITH marked AS ("  # noqa: S608
        " UPDATE integrations_workitem"
        f"   SET pending_report_file_id = CASE {which_file} END,"
        "        pending_status_code = status_code, updated_at = %s"
        f"  WHERE {to_write}"
        # Only the groups named above: a row that became reportable meanwhile waits for the
        # next run rather than being marked without a file.
        f"    AND (file_name, needs_amendment) IN ({pairs})"
        # Not in a file whose state keeps its rows back (_kept_back).
        "    AND (pending_report_file_id IS NULL OR pending_report_file_id NOT IN ("
        "         SELECT id FROM integrations_reportfile WHERE state = ANY(%s)))"
        " RETURNING pending_report_file_id, work_item_id, status_code)"
        " SELECT pending_report_file_id, work_item_id, status_code FROM marked"
        " ORDER BY pending_report_file_id"
        ") TO STDOUT WITH (FORMAT csv)"
    )
    params = [
        *which_params,
        now,
        *to_write_params,
        *pair_params,
        kept_back,
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
    kept_back: list[ReportFileState],
    actor: str,
) -> list[ReportFile]:
    """Mark the rows, build each file from its rows, keep the files that got any."""
    by_id = {
        report_file.pk: (list_name, report_file)
        for (list_name, _), report_file in placeholders.items()
    }
    data = _rows_mark(cycle=cycle, placeholders=placeholders, kept_back=kept_back)
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
        if report_file.state == ReportFileState.AWAITING_APPROVAL:
            report_file_awaiting_approval_record(
                report_file=report_file, broker=broker, actor=actor
            )
        written.append(report_file)
    return written


def report_file_awaiting_approval_record(
    *, report_file: ReportFile, broker: Broker, actor: str, written_by: str | None = None
) -> None:
    """The broker approves its uploads: the file waits for a second person
    (``report_approval``), and the ledger says what they will review. ``written_by``: its
    writer, when not ``actor`` (a file written before approval was turned on)."""
    ledger_event_append(
        kind=LedgerKind.REPORT_FILE_AWAITING_APPROVAL,
        broker_id=broker.broker_id,
        subject=report_file.file_name,
        actor=actor,
        data={
            **report_file_facts(report_file),
            "list": parse_file_name(report_file.file_name).data_type,
            "statuses": {
                str(code): n
                for code, n in response_status_counts(bytes(report_file.content)).items()
            },
            "written_by": actor if written_by is None else written_by,
        },
    )


def report_file_facts(report_file: ReportFile) -> dict[str, Any]:
    """What every ``report_file.*`` ledger event says of its file."""
    return {
        "cycle": report_file.cycle.drop_session_id,
        "file_name": report_file.file_name,
        "kind": report_file.kind,
        "rows": report_file.rows,
        "sha256": report_file.sha256,
    }
