"""Importing a DROP download ZIP: a new cycle, matched, with its requests, in one transaction.

``drop import`` and a pull (``services.cycle.drop.drop_pull``) call ``drop_zip_import`` with a ZIP
on disk::

    result = drop_zip_import(broker=broker, path=Path("20260312_4821_DROP.zip"), actor=...)
    result.cycle.drop_session_id, result.cycle.matched, result.requests.queued

The ZIP is streamed and validated row by row (``integrations.drop.files``) into a staging
table with COPY, then matched and written as work items, deletion requests and their
delivery jobs, with the cycle and its ledger event (``integrations.services.cycle.matching`` says
how, and why so). One odd part never holds back the rest: a member that is not a DROP list
is skipped (a ``drop.package_members_skipped`` event); a DROP list that cannot be read is
named in the cycle's ``unread_files``; a malformed row is kept as an ``UnreadableWorkItem``;
both raise an alert at once and are in ``ImportResult.not_imported``. A package that is not a
ZIP, holds no DROP list or is another broker's is refused whole; nothing of it is kept but a
``drop.import_refused`` event. The same ZIP imported again changes nothing. An id the
broker received in an earlier cycle is never a second work item: its row is set aside as
unreadable, and a package with no new id is refused whole. A Removed file closes the work
items it names (``services.cycle.drop_removed``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import CharField
from django.utils import timezone
from psycopg import sql

from integrations import enqueue
from integrations.drop.calendar import drop_date, drop_midnight, drop_today
from integrations.drop.download_zip import (
    MAX_UNREADABLE_KEPT,
    DownloadZipReader,
    escaped,
    iter_download_zip,
)
from integrations.drop.files import (
    DropFileError,
    RemovedRow,
    SetAside,
    WorkItemRow,
    parse_file_name,
)
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    CycleState,
    DirectiveReason,
    DropCycle,
    UnreadableWorkItem,
)
from integrations.services.cycle.canaries import canary_round_send
from integrations.services.cycle.cycle_state import cycle_state_refresh
from integrations.services.cycle.drop_removed import (
    NO_REMOVED,
    STAGED_REMOVED,
    RemovedResult,
    work_items_close_removed,
)
from integrations.services.cycle.isi_connections import isi_connections_refresh_for_broker
from integrations.services.cycle.matching import (
    ReceivedBefore,
    ReceivedRow,
    cycle_matches_collect,
    staged_items_analyze,
    staged_items_create,
    staged_items_drop,
    staged_items_match,
    staged_items_set_aside_received,
    staged_match_rates,
    work_items_insert_staged,
)
from integrations.services.cycle.requests import (
    MATCHES_TABLE,
    RequestsCreated,
    requests_create_for_matches,
)
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock
from integrations.services.providers.directives import directives_issue

_COPY_BATCH_ROWS = 8192
IMPORT_WORK_MEM = "64MB"


class DropImportError(Exception):
    """A ZIP was refused (nothing imported); the message names the file, line and reason."""


@dataclass(frozen=True)
class ImportResult:
    cycle: DropCycle
    created: bool  # False: this ZIP was imported before and nothing changed
    removed: RemovedResult
    requests: RequestsCreated
    # Where the time went, for operators and the bench (docs/benchmarks.md).
    import_seconds: float = 0.0  # read, validate and COPY the ZIP; write work items; Removed
    match_seconds: float = 0.0  # the join with the consumer hashes, and the match pairs
    requests_seconds: float = 0.0  # deletion requests, their delivery jobs, the ledger event
    commit_seconds: float = 0.0  # deferred foreign key checks and the WAL flush
    # What of the package was not imported, one (file, reason) each: DROP lists not read,
    # and lists with unreadable rows. Members that are not DROP lists are not in it.
    not_imported: tuple[SetAside, ...] = ()


_NO_REQUESTS = RequestsCreated(0, 0, 0, 0, 0, 0)


def drop_zip_import(
    *,
    broker: Broker,
    path: Path,
    actor: str,
    zip_name: str | None = None,
    downloaded_at: dt.datetime | None = None,
    by_hand: bool = False,
) -> ImportResult:
    """Import a DROP download ZIP for ``broker`` as a new cycle, matched, in one transaction.

    What of the package cannot be read, and the rows of ids received in an earlier cycle, are
    set aside, kept and named in ``ImportResult.not_imported``; the rest is imported. A
    package that is not a readable ZIP, holds no DROP list, is another broker's or holds no
    id not received before is refused whole (``DropImportError``).

    ``downloaded_at`` defaults to the package's date (from its file names) when that is
    earlier than now: DROP's 45 days run from the download, so a ZIP fetched by hand is
    never given a later due date than it has; a ``downloaded_at`` after now is refused (a
    due date later than DROP's, and a cycle that seems downloaded after its own import), and
    ``by_hand`` (an operator typed it) one before the package's date.
    Raises ``DropImportError``.
    """
    zip_name = zip_name or path.name
    if downloaded_at is not None and downloaded_at > timezone.now():
        raise DropImportError(
            f"{zip_name} not imported: its download time {downloaded_at.isoformat()} is in "
            "the future; give the time it was downloaded from DROP"
        )
    if by_hand and downloaded_at is not None:
        # Before anything happens (the refresh below calls the broker's API and writes to
        # the ledger): from the ZIP's file names, as _cycle_create checks it again.
        _download_before_package_refuse(path, zip_name, downloaded_at)
    try:
        with path.open("rb") as package:
            sha256 = hashlib.file_digest(package, "sha256").hexdigest()
    except OSError as exc:
        raise DropImportError(f"cannot read {path}: {exc.strerror}") from None
    existing = DropCycle.objects.filter(broker=broker, zip_sha256=sha256).first()
    if existing is not None:
        return _already_imported(existing)
    # Matching decides which ISI connections get requests: ask the broker's API which take
    # part now. Outside the import's transaction (HTTP), and never holding it up: an API
    # that does not answer leaves the last known connections.
    isi_connections_refresh_for_broker(broker=broker, actor=actor)
    try:
        return _import(broker, path, zip_name, sha256, downloaded_at, actor, by_hand=by_hand)
    except DropFileError as exc:
        ledger_event_append(
            kind=LedgerKind.DROP_IMPORT_REFUSED,
            broker_id=broker.broker_id,
            subject=zip_name,
            actor=actor,
            data={"zip_name": zip_name, "zip_sha256": sha256, "error": str(exc)},
        )
        raise DropImportError(f"{zip_name} refused, nothing imported: {exc}") from exc


def _import(
    broker: Broker,
    path: Path,
    zip_name: str,
    sha256: str,
    downloaded_at: dt.datetime | None,
    actor: str,
    *,
    by_hand: bool,
) -> ImportResult:
    clock = _PhaseClock()
    with transaction.atomic():
        with connection.cursor() as cursor:
            # The join and the insert's anti-join hash a million rows: in memory, not in
            # temp files (4 MB is PostgreSQL's default). For this transaction only.
            cursor.execute(f"SET LOCAL work_mem = '{IMPORT_WORK_MEM}'")
        reader = iter_download_zip(path, broker_id=broker.broker_id)
        staged = _stage(reader)
        staged_items_analyze(staged)
        files = {member.name: member.rows for member in reader.files}

        # From here on, serialized with this broker's other imports and late matches.
        matching_lock(broker=broker)
        existing = DropCycle.objects.filter(broker=broker, zip_sha256=sha256).first()
        if existing is not None:  # imported by someone else while this one was staging
            staged_items_drop(staged)
            return _already_imported(existing)
        received = staged_items_set_aside_received(
            broker=broker, staged=staged, kept_per_file=MAX_UNREADABLE_KEPT
        )
        if not received.rows_left:
            # The same download again (zipped anew, or fetched again by hand): refused whole.
            raise DropFileError(None, None, _all_received_before(received))
        cycle = _cycle_create(
            broker,
            zip_name=zip_name,
            sha256=sha256,
            downloaded_at=downloaded_at,
            files=files,
            unread_files={part.name: part.reason for part in reader.unread},
            unread_rows=reader.unread_rows,
            by_hand=by_hand,
        )
        _package_odd_parts_record(broker, cycle, reader, received, actor=actor)
        clock.lap("import")
        matched = staged_items_match(broker=broker, staged=staged)
        clock.lap("match")
        not_found = work_items_insert_staged(cycle=cycle, staged=staged) - matched
        clock.lap("import")
        cycle_matches_collect()
        clock.lap("match")
        # Counting per list type is bookkeeping, not matching: the import phase's.
        cycle.match_rates = staged_match_rates(staged)
        staged_items_drop(staged)
        clock.lap("import")
        requests = requests_create_for_matches(
            broker=broker, match_date=cycle.match_date, actor=actor
        )
        # Every cycle tests the deletion system again with the broker's canaries.
        canary_round_send(broker=broker, actor=actor, cycle=cycle)
        clock.lap("requests")
        # DROP sent this package, so it holds a status for every row of the last one: an
        # earlier cycle left open only by its unreadable rows owes nothing more. Their rows
        # before the items the Removed file closes, as a report holds its cycle while it
        # marks the cycle's items (``matching_lock``).
        earlier = list(
            DropCycle.objects.select_for_update()
            .filter(broker=broker, state=CycleState.OPEN)
            .exclude(pk=cycle.pk)
            .order_by("pk")
        )
        removed = work_items_close_removed(
            broker, actor=actor, drop_session_id=cycle.drop_session_id
        )
        clock.lap("import")
        # After the Removed file is applied: it may name items of this very download, and a
        # directive leaves out what DROP removed, as their requests were just cancelled.
        directives_issue(
            broker=broker,
            work_items=sql.Identifier(MATCHES_TABLE),
            reason=DirectiveReason.MATCH,
            actor=actor,
        )
        clock.lap("requests")
        _cycle_counts_save(cycle, matched=matched, not_found=not_found, removed=removed)
        ledger_event_append(
            kind=LedgerKind.DROP_CYCLE_IMPORTED,
            broker_id=broker.broker_id,
            subject=cycle.drop_session_id,
            actor=actor,
            data=_cycle_imported_data(
                cycle, requests=requests, removed=removed, reader=reader, received=received
            ),
        )
        for each in earlier:
            cycle_state_refresh(cycle=each, actor=actor)
        clock.lap("import")
    clock.lap("commit")
    return ImportResult(
        cycle=cycle,
        created=True,
        removed=removed,
        requests=requests,
        import_seconds=clock.seconds["import"],
        match_seconds=clock.seconds["match"],
        requests_seconds=clock.seconds["requests"],
        commit_seconds=clock.seconds["commit"],
        not_imported=_not_imported(cycle.unread_files, _unreadable_by_file(reader, received)),
    )


def _already_imported(cycle: DropCycle) -> ImportResult:
    """The answer for a ZIP imported before: its cycle, with what of it was not imported."""
    unreadable: dict[str, tuple[int, int, str]] = {}
    for name, line, reason in cycle.unreadable_items.order_by("file_name", "line").values_list(
        "file_name", "line", "reason"
    ):
        count, first_line, first_reason = unreadable.get(name, (0, line, reason))
        unreadable[name] = (count + 1, first_line, first_reason)
    return ImportResult(
        cycle,
        False,
        NO_REMOVED,
        _NO_REQUESTS,
        not_imported=_not_imported(cycle.unread_files, unreadable),
    )


def _unreadable_by_file(
    reader: DownloadZipReader, received: ReceivedBefore
) -> dict[str, tuple[int, int, str]]:
    """Per list with rows set aside (unreadable, or ids received before): their count, and
    the first one's line and reason."""
    first: dict[str, tuple[int, str]] = {}
    rows = [(row.file_name, row.line, row.reason) for row in reader.unreadable]
    rows += [(row.file_name, row.line, _received_before_reason(row)) for row in received.rows]
    for name, line, reason in rows:
        if name not in first or line < first[name][0]:
            first[name] = (line, reason)
    counts = dict(reader.unreadable_counts)
    for name, count in received.counts.items():
        counts[name] = counts.get(name, 0) + count
    return {name: (n, *first[name]) for name, n in counts.items()}


def _received_before_reason(row: ReceivedRow) -> str:
    return (
        f"work item id {row.work_item_id} was received before, in cycle {row.drop_session_id} "
        f"({row.zip_name}): one work item already, not imported again"
    )


def _all_received_before(received: ReceivedBefore) -> str:
    """Why a package whose every list row's id came before is refused, naming the cycles."""
    cycles = sorted({(int(row.drop_session_id), row.zip_name) for row in received.rows})
    named = ", ".join(f"cycle {session} ({zip_name})" for session, zip_name in cycles[:3])
    more = f" and {len(cycles) - 3} more" if len(cycles) > 3 else ""
    return (
        f"every work item id in it was received before, in {named}{more}: the same download "
        "again, with nothing new"
    )


def _not_imported(
    unread_files: dict[str, str], unreadable: dict[str, tuple[int, int, str]]
) -> tuple[SetAside, ...]:
    """One (file, reason) per DROP list not read and per list with unreadable rows."""
    parts = [SetAside(name, reason) for name, reason in sorted(unread_files.items())]
    for name, (count, line, reason) in sorted(unreadable.items()):
        parts.append(
            SetAside(
                name,
                f"{count} unreadable row(s) kept for staff, never reported (first: line "
                f"{line}, {reason}); see `drop doctor`",
            )
        )
    return tuple(parts)


def _package_odd_parts_record(
    broker: Broker,
    cycle: DropCycle,
    reader: DownloadZipReader,
    received: ReceivedBefore,
    *,
    actor: str,
) -> None:
    """Keep what of the package was not imported, and tell staff: members skipped (a
    ledger event), unreadable rows and rows of ids received before (kept, listed by ``drop
    doctor``), and an alert evaluation at once when a DROP list or row was set aside."""
    if reader.skipped:
        ledger_event_append(
            kind=LedgerKind.DROP_PACKAGE_MEMBERS_SKIPPED,
            broker_id=broker.broker_id,
            subject=cycle.drop_session_id,
            actor=actor,
            data={
                "drop_session_id": cycle.drop_session_id,
                "zip_name": cycle.zip_name,
                "zip_sha256": cycle.zip_sha256,
                "skipped": [{"name": m.name, "reason": m.reason} for m in reader.skipped],
            },
        )
    reason_chars = _column_chars("reason")
    unreadable = [
        UnreadableWorkItem(
            broker=broker,
            cycle=cycle,
            file_name=row.file_name,
            line=row.line,
            # Escaped first, then cut to the column: a row of bad bytes escapes to several
            # times its length.
            work_item_id=escaped(row.work_item_id, _column_chars("work_item_id")),
            text=escaped(row.text, _column_chars("text")),
            reason=row.reason[:reason_chars],
        )
        for row in reader.unreadable
    ]
    unreadable += [
        UnreadableWorkItem(
            broker=broker,
            cycle=cycle,
            file_name=row.file_name,
            line=row.line,
            work_item_id=row.work_item_id,
            text=f"{row.work_item_id},{row.hash}",  # the row as read: an id and a hash
            reason=_received_before_reason(row)[:reason_chars],
        )
        for row in received.rows
    ]
    UnreadableWorkItem.objects.bulk_create(unreadable)  # one INSERT for both kinds
    if not reader.complete or received.counts:
        enqueue.alerts_evaluate_enqueue()


def _column_chars(name: str) -> int:
    """The length of an ``UnreadableWorkItem`` text column: the model is its one home."""
    field = UnreadableWorkItem._meta.get_field(name)
    assert isinstance(field, CharField) and field.max_length is not None
    return field.max_length


def _cycle_create(
    broker: Broker,
    *,
    zip_name: str,
    sha256: str,
    downloaded_at: dt.datetime | None,
    files: dict[str, int],
    unread_files: dict[str, str],
    unread_rows: dict[str, int],
    by_hand: bool,
) -> DropCycle:
    """The new cycle, matched today and due ``DROPPORTAL_REPORT_DAYS`` after its download,
    both days of DROP's calendar (when not given: the package's time, or now if that is later)."""
    now = timezone.now()
    packaged = _package_time([*files, *unread_files], now)
    if by_hand and downloaded_at is not None and downloaded_at < packaged:
        # DROP made the package that day: a download before it is a typing error, and would
        # put the due date (and every figure counted from it) before the package existed.
        raise DropImportError(_before_package(zip_name, downloaded_at, packaged))
    # Stored, recorded and exported in UTC, whatever zone it was given in.
    downloaded_at = (downloaded_at or min(now, packaged)).astimezone(dt.UTC)
    return DropCycle.objects.create(
        broker=broker,
        mode=broker.mode,  # as it is now: a later switch does not make it another kind
        drop_session_id=_next_session_id(broker),
        zip_name=zip_name,
        zip_sha256=sha256,
        downloaded_at=downloaded_at,
        match_date=drop_today(now),
        due_date=drop_date(downloaded_at) + dt.timedelta(days=settings.DROPPORTAL_REPORT_DAYS),
        files=files,
        unread_files=unread_files,
        unread_rows=unread_rows,
    )


def _cycle_counts_save(
    cycle: DropCycle, *, matched: int, not_found: int, removed: RemovedResult
) -> None:
    """Record what the import found; a cycle with no work item, and no unreadable row owed a
    status (``UnreadableWorkItem.objects.owed()``: staff answer it in DROP's portal), owes
    DROP nothing."""
    cycle.work_items = matched + not_found
    cycle.matched = matched
    cycle.not_found = not_found
    cycle.removed = removed.rows
    owes = cycle.work_items or UnreadableWorkItem.objects.owed().filter(cycle=cycle).exists()
    cycle.state = CycleState.OPEN if owes else CycleState.NOTHING_OWED
    cycle.save(
        update_fields=["work_items", "matched", "not_found", "removed", "state", "match_rates"]
    )


def _cycle_imported_data(
    cycle: DropCycle,
    *,
    requests: RequestsCreated,
    removed: RemovedResult,
    reader: DownloadZipReader,
    received: ReceivedBefore,
) -> dict[str, Any]:
    """The ``drop.cycle_imported`` ledger event's data."""
    return {
        "drop_session_id": cycle.drop_session_id,
        "zip_name": cycle.zip_name,
        "zip_sha256": cycle.zip_sha256,
        "downloaded_at": cycle.downloaded_at.isoformat(),
        "due_date": cycle.due_date.isoformat(),
        "files": cycle.files,
        "work_items": cycle.work_items,
        "matched": cycle.matched,
        "not_found": cycle.not_found,
        "match_rates": cycle.match_rates,
        "deletion_requests": requests.deletion_requests,
        "queued": requests.queued,
        "pending": requests.pending,
        "removed": {
            "rows": removed.rows,
            "closed": removed.closed,
            "unknown": removed.unknown,
            "requests_cancelled": removed.requests_cancelled,
        },
        "unread_files": cycle.unread_files,
        "unread_rows": cycle.unread_rows,
        "unreadable_rows": reader.unreadable_counts,
        # Per list, the rows of ids received in an earlier cycle: set aside, and not
        # received again in the yearly figures (which count ``unreadable_rows``).
        "received_before": received.counts,
    }


class _PhaseClock:
    """Adds the time since the previous lap to the named phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(
            ("import", "match", "requests", "commit"), 0.0
        )
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self._last
        self._last = now


def _stage(reader: DownloadZipReader) -> str:
    """COPY every row of the ZIP into the staging tables, validating as it streams.

    Returns the list rows' table (``staged_items_create``); Removed rows go to a temp table.
    """
    staged = staged_items_create()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {STAGED_REMOVED}")
        cursor.execute(
            f"CREATE TEMP TABLE {STAGED_REMOVED} ( work_item_id text NOT NULL) ON COMMIT DROP"
        )
        # Members come whole, one after the other: one COPY per run of the same row type.
        # Every value was validated by the reader (letters, digits, '+/=', '_' and '.'),
        # so none needs escaping in COPY's text format.
        for row_type, rows in itertools.groupby(reader, key=type):
            if row_type is WorkItemRow:
                table = f"{staged} (work_item_id, hash_type, hash, file_name, line)"
                lines = _item_lines(rows)  # type: ignore[arg-type]
            else:
                table = f"{STAGED_REMOVED} (work_item_id)"
                lines = _removed_lines(rows)  # type: ignore[arg-type]
            with cursor.copy(f"COPY {table} FROM STDIN") as copy:
                while batch := list(itertools.islice(lines, _COPY_BATCH_ROWS)):
                    copy.write("".join(batch))
    return staged


def _item_lines(rows: Iterable[WorkItemRow]) -> Iterator[str]:
    for row in rows:
        yield f"{row.work_item_id}\t{row.hash_type}\t{row.hash}\t{row.file_name}\t{row.line}\n"


def _removed_lines(rows: Iterable[RemovedRow]) -> Iterator[str]:
    for row in rows:
        yield f"{row.work_item_id}\n"


def _download_before_package_refuse(path: Path, zip_name: str, downloaded_at: dt.datetime) -> None:
    """``DropImportError`` when ``downloaded_at`` is before the date in the names of the
    package's members. A package that cannot be listed is left to the import to refuse."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [
                info.filename.replace("\\", "/").rsplit("/", 1)[-1] for info in archive.infolist()
            ]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return
    packaged = _package_time(names, downloaded_at)
    if downloaded_at < packaged:
        raise DropImportError(_before_package(zip_name, downloaded_at, packaged))


def _before_package(zip_name: str, downloaded_at: dt.datetime, packaged: dt.datetime) -> str:
    return (
        f"{zip_name} not imported: its download time {downloaded_at.isoformat()} is before "
        f"the package's date, {drop_date(packaged).isoformat()}; give the time it was "
        "downloaded from DROP"
    )


def _package_time(names: Iterable[str], default: dt.datetime) -> dt.datetime:
    """The start of the earliest date in the package's file names, a day of DROP's calendar
    (``default`` when no name carries a valid one)."""
    days = []
    for name in names:
        try:
            days.append(parse_file_name(name).date)
        except DropFileError:
            continue
    if not days:
        return default
    return drop_midnight(min(days))


def _next_session_id(broker: Broker) -> str:
    # Called under matching_lock, which serializes this broker's imports.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(max(drop_session_id::bigint), 0) + 1"
            "  FROM integrations_dropcycle WHERE broker_id = %s",
            [broker.pk],
        )
        return str(cursor.fetchone()[0])
