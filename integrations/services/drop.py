"""The DROP cycle's write paths: pull a download from DROP, import a ZIP, close removed items.

``drop pull`` and the periodic pull call ``drop_pull``; ``drop import`` calls
``drop_zip_import`` with a ZIP on disk::

    result = drop_pull(broker=broker, actor="cli:alice")     # download, import, match
    result = drop_zip_import(broker=broker, path=Path("20260312_4821_DROP.zip"), actor=...)
    result.cycle.drop_session_id, result.cycle.matched, result.requests.queued

An import is one transaction: the ZIP is streamed and validated row by row
(``integrations.drop.files``) into a staging table with COPY, then matched and written as
work items, deletion requests and their delivery jobs, with the cycle and its ledger event
(``integrations.services.matching`` says how, and why so). One odd part never holds back
the rest: a member that is not a DROP list is skipped (a ``drop.package_members_skipped``
event); a DROP list that cannot be read is named in the cycle's ``unread_files``; a
malformed row is kept as an ``UnreadableWorkItem``; both raise an alert at once and are
in ``ImportResult.not_imported``. A package that is not a ZIP, holds no DROP list or is
another broker's is refused whole; nothing of it is kept but a ``drop.import_refused``
event. The same ZIP imported again changes nothing.

Every call to DROP is a ``drop.api_call`` ledger event (never with the key). A downloaded
package is kept under ``var/drop-packages/<broker id>/``: when its import fails, staff fix
the cause and import that file with ``drop import`` (DROP may not send it again).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from integrations import enqueue
from integrations.drop.calendar import drop_date, drop_timezone, drop_today
from integrations.drop.client import DropApiError, DropClient
from integrations.drop.files import (
    DownloadZipReader,
    DropFileError,
    RemovedRow,
    SetAside,
    WorkItemRow,
    iter_download_zip,
    parse_file_name,
)
from integrations.drop.transport import OnProgress
from integrations.file_digest import file_sha256
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    CycleState,
    DropCycle,
    RequestState,
    UnreadableWorkItem,
    WorkItemState,
)
from integrations.services.brokers import broker_drop_url
from integrations.services.isi_connections import isi_connections_refresh_for_broker
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock
from integrations.services.matching import (
    cycle_matches_collect,
    staged_items_analyze,
    staged_items_create,
    staged_items_drop,
    staged_items_match,
    work_items_insert_staged,
)
from integrations.services.requests import RequestsCreated, requests_create_for_matches

log = logging.getLogger(__name__)

PACKAGES_DIR = settings.DROPPORTAL_VAR_DIR / "drop-packages"
STAGED_REMOVED = "drop_staged_removed"
# DROP client tuning: (connect, read) seconds per HTTP attempt, the wall-clock bound of one
# attempt until DROP's answer begins (a package's body is bounded by a stall instead,
# DROPPORTAL_DROP_STALL_SECONDS), and retries of 5xx/timeouts.
DROP_TIMEOUT: tuple[float, float] = (5.0, 60.0)
DROP_TOTAL_TIMEOUT = 300.0
DROP_MAX_RETRIES = 4
DEFAULT_MAX_WAIT_SECONDS = 600.0  # bound on waiting through 202/429 and retry backoff
_COPY_BATCH_ROWS = 8192
IMPORT_WORK_MEM = "64MB"
# What a Removed file cancels: everything not final but what the broker is acting on
# (dispatched, awaiting its outcome). Failed and undeliverable ones included: nothing more is
# sent to the broker for a removed identifier (redelivery and redispatch refuse them).
_CANCELLED_ON_REMOVAL = (
    RequestState.PENDING,
    RequestState.QUEUED,
    RequestState.FAILED,
    RequestState.UNDELIVERABLE,
)


class DropImportError(Exception):
    """A ZIP was refused (nothing imported); the message names the file, line and reason."""


class DropPullError(Exception):
    """A pull stopped (DROP's answer, a refused package); the message says what to do."""


@dataclass(frozen=True)
class RemovedResult:
    rows: int  # rows of the Removed file
    closed: int  # work items closed by them
    unknown: int  # ids with no open work item of this broker (unknown or closed before)
    requests_cancelled: int


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


@dataclass(frozen=True)
class PullResult:
    outcome: Literal["imported", "already_imported", "nothing_new"]
    message: str = ""
    imported: ImportResult | None = None
    path: Path | None = None


_NO_REMOVED = RemovedResult(0, 0, 0, 0)
_NO_REQUESTS = RequestsCreated(0, 0, 0, 0, 0, 0)


def drop_zip_import(
    *,
    broker: Broker,
    path: Path,
    actor: str,
    zip_name: str | None = None,
    downloaded_at: dt.datetime | None = None,
) -> ImportResult:
    """Import a DROP download ZIP for ``broker`` as a new cycle, matched, in one transaction.

    What of the package cannot be read is set aside, kept and named in
    ``ImportResult.not_imported``; the rest is imported. A package that is not a readable
    ZIP, holds no DROP list or is another broker's is refused whole (``DropImportError``).

    ``downloaded_at`` defaults to the package's date (from its file names) when that is
    earlier than now: DROP's 45 days run from the download, so a ZIP fetched by hand is
    never given a later due date than it has. Raises ``DropImportError``.
    """
    zip_name = zip_name or path.name
    try:
        sha256 = file_sha256(path)
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
        return _import(broker, path, zip_name, sha256, downloaded_at, actor)
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
        cycle = _cycle_create(
            broker,
            zip_name=zip_name,
            sha256=sha256,
            downloaded_at=downloaded_at,
            files=files,
            unread_files={part.name: part.reason for part in reader.unread},
        )
        _package_odd_parts_record(broker, cycle, reader, actor=actor)
        clock.lap("import")
        matched = staged_items_match(broker=broker, staged=staged)
        clock.lap("match")
        not_found = work_items_insert_staged(cycle=cycle, staged=staged) - matched
        clock.lap("import")
        cycle_matches_collect()
        clock.lap("match")
        staged_items_drop(staged)
        clock.lap("import")
        requests = requests_create_for_matches(
            broker=broker, match_date=cycle.match_date, actor=actor
        )
        clock.lap("requests")
        removed = _close_removed(broker, actor=actor, drop_session_id=cycle.drop_session_id)
        _cycle_counts_save(cycle, matched=matched, not_found=not_found, removed=removed)
        ledger_event_append(
            kind=LedgerKind.DROP_CYCLE_IMPORTED,
            broker_id=broker.broker_id,
            subject=cycle.drop_session_id,
            actor=actor,
            data=_cycle_imported_data(cycle, requests=requests, removed=removed, reader=reader),
        )
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
        not_imported=_not_imported(cycle.unread_files, _unreadable_by_file(reader)),
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
        _NO_REMOVED,
        _NO_REQUESTS,
        not_imported=_not_imported(cycle.unread_files, unreadable),
    )


def _unreadable_by_file(reader: DownloadZipReader) -> dict[str, tuple[int, int, str]]:
    """Per list with unreadable rows: their count, and the first one's line and reason."""
    first = {}
    for row in reversed(reader.unreadable):
        first[row.file_name] = (row.line, row.reason)
    return {name: (n, *first[name]) for name, n in reader.unreadable_counts.items()}


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
    broker: Broker, cycle: DropCycle, reader: DownloadZipReader, *, actor: str
) -> None:
    """Keep what of the package was not imported, and tell staff: members skipped (a
    ledger event), unreadable rows (kept, listed by ``drop doctor``), and an alert
    evaluation at once when a DROP list or row could not be read."""
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
    UnreadableWorkItem.objects.bulk_create(
        UnreadableWorkItem(
            broker=broker,
            cycle=cycle,
            file_name=row.file_name,
            line=row.line,
            work_item_id=row.work_item_id,
            text=row.text,
            reason=row.reason[:255],
        )
        for row in reader.unreadable
    )
    if not reader.complete:
        enqueue.alerts_evaluate_enqueue()


def _cycle_create(
    broker: Broker,
    *,
    zip_name: str,
    sha256: str,
    downloaded_at: dt.datetime | None,
    files: dict[str, int],
    unread_files: dict[str, str],
) -> DropCycle:
    """The new cycle, matched today and due ``DROPPORTAL_REPORT_DAYS`` after its download,
    both days of DROP's calendar (when not given: the package's time, or now if that is later)."""
    now = timezone.now()
    # Stored, recorded and exported in UTC, whatever zone it was given in.
    downloaded_at = (
        downloaded_at or min(now, _package_time([*files, *unread_files], now))
    ).astimezone(dt.UTC)
    return DropCycle.objects.create(
        broker=broker,
        drop_session_id=_next_session_id(broker),
        zip_name=zip_name,
        zip_sha256=sha256,
        downloaded_at=downloaded_at,
        match_date=drop_today(now),
        due_date=drop_date(downloaded_at) + dt.timedelta(days=settings.DROPPORTAL_REPORT_DAYS),
        files=files,
        unread_files=unread_files,
    )


def _cycle_counts_save(
    cycle: DropCycle, *, matched: int, not_found: int, removed: RemovedResult
) -> None:
    """Record what the import found; a cycle with no work item owes DROP nothing."""
    cycle.work_items = matched + not_found
    cycle.matched = matched
    cycle.not_found = not_found
    cycle.removed = removed.rows
    cycle.state = CycleState.OPEN if cycle.work_items else CycleState.NOTHING_OWED
    cycle.save(update_fields=["work_items", "matched", "not_found", "removed", "state"])


def _cycle_imported_data(
    cycle: DropCycle,
    *,
    requests: RequestsCreated,
    removed: RemovedResult,
    reader: DownloadZipReader,
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
        "unreadable_rows": reader.unreadable_counts,
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
                table = f"{staged} (work_item_id, hash_type, hash, file_name)"
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
        yield f"{row.work_item_id}\t{row.hash_type}\t{row.hash}\t{row.file_name}\n"


def _removed_lines(rows: Iterable[RemovedRow]) -> Iterator[str]:
    for row in rows:
        yield f"{row.work_item_id}\n"


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
    return dt.datetime.combine(min(days), dt.time(), tzinfo=drop_timezone())


def _next_session_id(broker: Broker) -> str:
    # Called under matching_lock, which serializes this broker's imports.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(max(drop_session_id::bigint), 0) + 1"
            "  FROM integrations_dropcycle WHERE broker_id = %s",
            [broker.pk],
        )
        return str(cursor.fetchone()[0])


def _close_removed(broker: Broker, *, actor: str, drop_session_id: str) -> RemovedResult:
    """Close the work items named in the staged Removed rows; cancel what was not sent.

    No status is owed for them. Every request not final is cancelled (pending, queued,
    failed, undeliverable; a queued one's delivery job finds it cancelled and skips it), so
    nothing more is sent for them; requests already dispatched keep their course, since the
    broker may be acting on them, but are never sent again.
    """
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {STAGED_REMOVED}")  # noqa: S608
        rows = int(cursor.fetchone()[0])
        if not rows:
            return _NO_REMOVED
        cursor.execute("DROP TABLE IF EXISTS drop_closed_items")
        cursor.execute(
            "CREATE TEMP TABLE drop_closed_items ON COMMIT DROP AS"  # noqa: S608
            " WITH closed AS ("
            "   UPDATE integrations_workitem w"
            "      SET state = %(removed)s, status_code = NULL, needs_amendment = false,"
            "          updated_at = now()"
            f"    FROM {STAGED_REMOVED} r"
            "    WHERE w.broker_id = %(broker)s AND w.work_item_id = r.work_item_id"
            "      AND w.state <> %(removed)s"
            "   RETURNING w.id)"
            " SELECT id FROM closed",
            {"removed": WorkItemState.REMOVED, "broker": broker.pk},
        )
        closed = cursor.rowcount
        cancel: dict[str, Any] = {
            "cancelled": RequestState.CANCELLED,
            "not_dispatched": list(_CANCELLED_ON_REMOVAL),
            "reason": "work item removed by DROP (consumer cancelled)",
        }
        cursor.execute(
            "UPDATE integrations_deletionrequest d"
            "   SET state = %(cancelled)s, next_attempt_at = NULL, completed_at = now(),"
            "       last_error = %(reason)s"
            "  FROM drop_closed_items c"
            " WHERE d.work_item_id = c.id AND d.state = ANY(%(not_dispatched)s)",
            cancel,
        )
        cancelled = cursor.rowcount
        cursor.execute(
            "UPDATE integrations_resolutionrequest rr"
            "   SET state = %(cancelled)s, next_attempt_at = NULL, completed_at = now(),"
            "       last_error = %(reason)s"
            "  FROM drop_closed_items c"
            " WHERE rr.work_item_id = c.id AND rr.state = ANY(%(not_dispatched)s)",
            cancel,
        )
        cancelled += cursor.rowcount
        cursor.execute(
            "UPDATE integrations_saasdeletion sd"
            "   SET state = %(cancelled)s, next_attempt_at = NULL, completed_at = now(),"
            "       last_error = %(reason)s"
            "  FROM integrations_resolutionrequest rr, drop_closed_items c"
            " WHERE sd.resolution_id = rr.id AND rr.work_item_id = c.id"
            "   AND sd.state = ANY(%(not_dispatched)s)",
            cancel,
        )
        cancelled += cursor.rowcount
        cursor.execute("DROP TABLE drop_closed_items")
    result = RemovedResult(
        rows=rows, closed=closed, unknown=rows - closed, requests_cancelled=cancelled
    )
    ledger_event_append(
        kind=LedgerKind.DROP_WORK_ITEMS_REMOVED,
        broker_id=broker.broker_id,
        subject=drop_session_id,
        actor=actor,
        data={
            "drop_session_id": drop_session_id,
            "rows": result.rows,
            "work_items_closed": result.closed,
            "ids_not_open": result.unknown,
            "requests_cancelled": result.requests_cancelled,
        },
    )
    return result


# ---------------------------------------------------------------- pulling from DROP


def wait(seconds: float) -> None:
    """How a pull waits between DROP attempts (202, 429, retries); tests replace it."""
    time.sleep(seconds)


def drop_client_for(
    broker: Broker, *, actor: str, max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS
) -> DropClient:
    """A DROP client for ``broker``: URL by mode (or override), its key, calls in the ledger."""
    if not broker.drop_api_key:
        raise DropPullError(
            f"broker {broker.broker_id} has no DROP API key: set it in the admin first"
        )
    base_url = broker_drop_url(broker)  # where its key is sent: one rule with broker_update

    def on_call(method: str, path: str, status: int | None, duration_ms: int, outcome: str) -> None:
        ledger_event_append(
            kind=LedgerKind.DROP_API_CALL,
            broker_id=broker.broker_id,
            subject=f"{method} {path}",
            actor=actor,
            data={
                "base_url": base_url,
                "method": method,
                "path": path,
                "status": status,
                "duration_ms": duration_ms,
                "outcome": outcome,
            },
        )

    return DropClient(
        base_url,
        broker.drop_api_key,
        timeout=DROP_TIMEOUT,
        total_timeout=DROP_TOTAL_TIMEOUT,
        stall_timeout=settings.DROPPORTAL_DROP_STALL_SECONDS,
        max_retries=DROP_MAX_RETRIES,
        max_wait_seconds=max_wait_seconds,
        allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
        on_call=on_call,
        sleep=lambda seconds: wait(seconds),
    )


def drop_pull(
    *,
    broker: Broker,
    actor: str,
    max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS,
    on_progress: OnProgress | None = None,
) -> PullResult:
    """Download DROP's current package for ``broker`` and import it; raises DropPullError.

    Waits through 202 and 429 (and retries 5xx, timeouts, stalled and cut bodies) for at
    most ``max_wait_seconds``; the package streams to disk, ``on_progress(received,
    announced)`` following it. A refusal (401, 403, 409, ...) or a refused package is a
    ``drop.pull_failed`` event and nothing is imported; the next pull starts afresh.
    """
    started = time.monotonic()
    try:
        client = drop_client_for(broker, actor=actor, max_wait_seconds=max_wait_seconds)
        directory = PACKAGES_DIR / broker.broker_id
        directory.mkdir(parents=True, exist_ok=True)
        download = client.download(directory, on_progress=on_progress)
        download_ms = int((time.monotonic() - started) * 1000)
    except (DropApiError, DropPullError, ValueError, OSError) as exc:
        message = str(exc)
        status = getattr(exc, "status", None)
        if isinstance(exc, DropApiError) and exc.status in (401, 403):
            message += "; check the broker's DROP API key and DROP account, then pull again"
            reason = "credentials"
        elif isinstance(exc, DropApiError) and status is not None and 400 <= status < 500:
            reason = "refused"
        else:
            reason = "unreachable"  # no answer, 5xx, cut off, or nothing to write to
        _pull_failed(broker, actor, message, status, reason)
        raise DropPullError(message) from exc

    if download.kind == "nothing_new":
        _pulled(broker, actor, {"outcome": "nothing_new", "message": download.message})
        return PullResult("nothing_new", message=download.message or "")

    assert download.path is not None
    try:
        imported = drop_zip_import(
            broker=broker,
            path=download.path,
            zip_name=download.file_name,
            downloaded_at=timezone.now(),
            actor=actor,
        )
    except DropImportError as exc:
        message = (
            f"{exc}. The package is kept at {download.path}; once the cause is fixed, "
            f"import it with: manage.py drop import --broker {broker.broker_id} {download.path}"
        )
        _pull_failed(broker, actor, message, None, "package")
        raise DropPullError(message) from exc
    outcome: Literal["imported", "already_imported"] = (
        "imported" if imported.created else "already_imported"
    )
    _pulled(
        broker,
        actor,
        {
            "outcome": outcome,
            "zip_name": download.file_name,
            "zip_sha256": download.sha256,
            "drop_session_id": imported.cycle.drop_session_id,
            # The download (from the first call to the package on disk, waits included).
            "size_bytes": download.size_bytes,
            "duration_ms": download_ms,
            "attempts": download.attempts,
        },
    )
    return PullResult(outcome, imported=imported, path=download.path)


def _pulled(broker: Broker, actor: str, data: dict[str, object]) -> None:
    with transaction.atomic():
        Broker.objects.filter(pk=broker.pk).update(last_pulled_at=timezone.now())
        ledger_event_append(
            kind=LedgerKind.DROP_PULLED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data=data,
        )


def _pull_failed(broker: Broker, actor: str, message: str, status: int | None, reason: str) -> None:
    """``reason`` (for alerts): credentials (401/403), refused (another 4xx), package (the
    download was refused on import) or unreachable."""
    log.warning("DROP pull for broker %s failed: %s", broker.broker_id, message)
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.DROP_PULL_FAILED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={"error": message, "status": status, "reason": reason},
        )
        # A refusal alerts at once; DROP unreachable only after a day of failed pulls, which
        # the periodic evaluation notices.
        if reason != "unreachable":
            enqueue.alerts_evaluate_enqueue()
