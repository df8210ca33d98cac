"""Writing a signed evidence pack for a broker's auditors (format: ``integrations.evidence.pack``).

    result = evidence_pack_export(broker=broker, cycle=cycle, out=binary_file,
                                  actor="cli:alice", via="command")
    result = evidence_pack_export(broker=broker, since=start, until=end, out=..., ...)

Everything streams: the outcome history comes from PostgreSQL's ``COPY``, the ledger range
line by line, each response file in chunks; the ZIP is written member by member to ``out``
(a seekable binary file), hashing as it goes. The manifest comes last and is signed with
``DROPPORTAL_EVIDENCE_KEY`` (or a key generated into ``var/``). The export is an
``evidence.exported`` ledger event.

The records are read in one snapshot, after sealing the ledger. The ledger range starts at
the broker's first event since the period's start (or since the download of the earliest
cycle the period's records belong to) and runs to the time of export, so every outcome and
file of the period has its events in the pack however late it came.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.module_loading import import_string

from integrations.drop.calendar import drop_date
from integrations.evidence import pack
from integrations.ledger_hash import GENESIS_HASH, canonical_json
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    DropCycle,
    ReportFile,
    ReportFileState,
    ReportKind,
    RequestState,
    WorkItemState,
)
from integrations.selectors.drop_metrics import METRIC_STATUSES
from integrations.selectors.outcomes import deletion_outcomes_csv
from integrations.services.ledger import ledger_event_append, ledger_seal

_CONTENT_CHUNK = 8 << 20
_OPEN_REQUEST_STATES = (
    RequestState.PENDING,
    RequestState.QUEUED,
    RequestState.DISPATCHED,
    RequestState.FAILED,
    RequestState.UNDELIVERABLE,
)
# Every file DROP got, whatever it answered (a refused or discarded one too: what was
# tried, and why it was given up, is evidence).
_SENT_STATES = (
    ReportFileState.ACCEPTED,
    ReportFileState.REJECTED,
    ReportFileState.MANUAL,
    ReportFileState.REFUSED,
    ReportFileState.DISCARDED,
)

DESCRIPTIONS = {
    pack.OUTCOMES: "outcome history of the period's deletion requests, one row each (CSV)",
    pack.LEDGER: "the ledger range: the broker's events in full, other events as hashes",
    pack.SUMMARY: "a readable summary (HTML)",
}


def evidence_signing_key() -> Ed25519PrivateKey:
    """``DROPPORTAL_EVIDENCE_KEY``, or the one ``DROPPORTAL_EVIDENCE_KEY_GENERATOR`` makes
    (into ``var/``) on first use."""
    pem = (
        settings.DROPPORTAL_EVIDENCE_KEY
        or import_string(settings.DROPPORTAL_EVIDENCE_KEY_GENERATOR)()
    )
    try:
        return pack.load_private_key(pem)
    except ValueError as exc:
        raise ValidationError(f"DROPPORTAL_EVIDENCE_KEY: {exc}") from None


def evidence_public_key_pem() -> str:
    return pack.public_key_pem(evidence_signing_key())


@dataclass(frozen=True)
class EvidenceExport:
    manifest: dict[str, Any]
    manifest_sha256: str

    @property
    def files(self) -> int:
        return len(self.manifest["files"])


def evidence_pack_export(
    *,
    broker: Broker,
    out: IO[bytes],
    actor: str,
    via: str,
    cycle: DropCycle | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> EvidenceExport:
    """Write the pack of ``cycle``, or of ``since``..``until`` (until exclusive), to ``out``."""
    _check_pack_period(broker=broker, cycle=cycle, since=since, until=until)
    key = evidence_signing_key()
    ledger_seal()
    exported_at = timezone.now()
    with _snapshot():
        writer = _PackWriter(out)
        period = _Period(broker=broker, cycle=cycle, since=since, until=until)
        writer.write(pack.OUTCOMES, period.outcome_chunks(), rows=_CsvRecordCounter())
        span = _LedgerRange(broker=broker, since=period.ledger_since())
        writer.write(pack.LEDGER, span.lines(), rows=_LineCounter())
        _write_report_files(writer, period)
        with timezone.override(dt.UTC):  # an export says UTC, whatever zone staff read in
            summary = render_to_string(
                "evidence/summary.html",
                {
                    "broker": broker,
                    "period": period.describe(),
                    "exported_at": exported_at,
                    "cycles": period.cycle_summaries(),
                    "span": span.describe(),
                    "files": writer.entries,
                    "requests_open": period.requests_open(),
                },
            )
        writer.write(pack.SUMMARY, [summary.encode()], rows=None)
    manifest = _manifest(
        broker=broker,
        period=period,
        span=span,
        exported_at=exported_at,
        actor=actor,
        key=key,
        files=writer.entries,
    )
    manifest_bytes = json.dumps(manifest, indent=2, ensure_ascii=False).encode() + b"\n"
    writer.write_raw(pack.MANIFEST, manifest_bytes)
    writer.write_raw(pack.SIGNATURE, pack.sign_manifest(key, manifest_bytes))
    writer.close()
    manifest_sha256 = hashlib.sha256(manifest_bytes).hexdigest()
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.EVIDENCE_EXPORTED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={
                "via": via,
                "period": manifest["period"],
                "manifest_sha256": manifest_sha256,
                "files": len(writer.entries),
                "ledger_range": {
                    k: manifest["ledger_range"][k] for k in ("first_event_id", "last_event_id")
                },
                "signing_key_sha256": manifest["signing_key"]["sha256"],
            },
        )
    return EvidenceExport(manifest=manifest, manifest_sha256=manifest_sha256)


def _check_pack_period(
    *,
    broker: Broker,
    cycle: DropCycle | None,
    since: dt.datetime | None,
    until: dt.datetime | None,
) -> None:
    if (cycle is None) == (since is None or until is None):
        raise ValidationError("give either a cycle or both --since and --until")
    if cycle is not None and cycle.broker_id != broker.pk:
        raise ValidationError(f"cycle {cycle.drop_session_id} is not broker {broker}'s")
    if since is not None and until is not None and until <= since:
        raise ValidationError("--until must be after --since")


def _write_report_files(writer: _PackWriter, period: _Period) -> None:
    """Each response file of the period exactly as sent to DROP, and DROP's answer to it."""
    for report_file in period.report_files():
        name = f"{pack.DROP_DIR}{report_file.cycle.drop_session_id}/{report_file.file_name}"
        writer.write(
            name,
            _report_file_content(report_file.pk),
            rows=report_file.rows,
            description=f"response file ({report_file.kind}) exactly as sent to DROP",
        )
        writer.write(
            name + pack.ANSWER_SUFFIX,
            [canonical_json(_answer(report_file)).encode() + b"\n"],
            rows=1,
            description="DROP's answer to it",
        )


def _manifest(
    *,
    broker: Broker,
    period: _Period,
    span: _LedgerRange,
    exported_at: dt.datetime,
    actor: str,
    key: Ed25519PrivateKey,
    files: list[dict[str, Any]],
) -> dict[str, Any]:
    """What the pack holds and who made it, signed with ``key``."""
    return {
        "format": pack.FORMAT,
        "broker": {"broker_id": broker.broker_id, "name": broker.name},
        "period": period.describe(),
        "software": {"name": "dropportal", "version": _version()},
        "exported_at": exported_at.isoformat(),
        "exported_by": actor,
        "ledger_range": span.describe(),
        "signing_key": {
            "algorithm": "Ed25519",
            "sha256": pack.key_fingerprint(key),
            "public_key": pack.public_key_pem(key),
        },
        "files": files,
    }


def _version() -> str:
    try:
        return metadata.version("dropportal")
    except metadata.PackageNotFoundError:
        return "unknown"


@contextlib.contextmanager
def _snapshot() -> Iterator[None]:
    """One consistent snapshot for every read of the pack (REPEATABLE READ when this is
    the outermost transaction; inside another one, that one's snapshot)."""
    outer = connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cursor:
        if not outer:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cursor.execute("SET LOCAL jit = off")
        yield


# ------------------------------------------------------------------ what the pack covers


class _Period:
    def __init__(
        self,
        *,
        broker: Broker,
        cycle: DropCycle | None,
        since: dt.datetime | None,
        until: dt.datetime | None,
    ) -> None:
        self.broker, self.cycle, self.since, self.until = broker, cycle, since, until

    def describe(self) -> dict[str, Any]:
        if self.cycle is not None:
            return {
                "cycle": self.cycle.drop_session_id,
                "downloaded_at": self.cycle.downloaded_at.isoformat(),
            }
        assert self.since is not None and self.until is not None
        return {"since": self.since.isoformat(), "until": self.until.isoformat()}

    def requests(self) -> Any:
        requests = DeletionRequest.objects.filter(broker=self.broker)
        if self.cycle is not None:
            return requests.filter(drop_session_id=self.cycle.drop_session_id)
        return requests.filter(matched_at__gte=self.since, matched_at__lt=self.until)

    def requests_open(self) -> int:
        """The period's deletion requests with no final outcome yet."""
        return int(self.requests().filter(state__in=_OPEN_REQUEST_STATES).count())

    def outcome_chunks(self) -> Iterator[bytes]:
        return deletion_outcomes_csv(requests=self.requests())

    def report_files(self) -> Iterator[ReportFile]:
        files = ReportFile.objects.filter(broker=self.broker, state__in=_SENT_STATES)
        if self.cycle is not None:
            files = files.filter(cycle=self.cycle)
        else:
            files = files.filter(created_at__gte=self.since, created_at__lt=self.until)
        return (
            files.select_related("cycle")
            .defer("content")
            .order_by("cycle__downloaded_at", "created_at", "pk")
            .iterator(chunk_size=100)
        )

    def cycles(self) -> Any:
        if self.cycle is not None:
            return DropCycle.objects.filter(pk=self.cycle.pk)
        sessions = self.requests().values("drop_session_id").distinct()
        files = ReportFile.objects.filter(
            broker=self.broker,
            state__in=_SENT_STATES,
            created_at__gte=self.since,
            created_at__lt=self.until,
        ).values("cycle_id")
        downloaded = DropCycle.objects.filter(
            broker=self.broker, downloaded_at__gte=self.since, downloaded_at__lt=self.until
        ).values("pk")
        return DropCycle.objects.filter(broker=self.broker).filter(
            Q(drop_session_id__in=sessions) | Q(pk__in=files) | Q(pk__in=downloaded)
        )

    def ledger_since(self) -> dt.datetime:
        earliest = min(
            (c.downloaded_at for c in self.cycles().only("downloaded_at")),
            default=self.since or self.cycle.downloaded_at,  # type: ignore[union-attr]
        )
        return min(earliest, self.since) if self.since else earliest

    def cycle_summaries(self) -> list[dict[str, Any]]:
        cycles = list(self.cycles().order_by("downloaded_at"))
        counts: dict[int, dict[str, int]] = {cycle.pk: {} for cycle in cycles}
        with connection.cursor() as cursor:
            cursor.execute(
                _CYCLE_COUNTS, [WorkItemState.REMOVED.value, [cycle.pk for cycle in cycles]]
            )
            for cycle_id, key, count in cursor.fetchall():
                counts[cycle_id][key] = count
        summaries = []
        for cycle in cycles:
            with connection.cursor() as cursor:
                cursor.execute(_CYCLE_REPORTED_AT, [self.broker.broker_id, cycle.drop_session_id])
                reported_at = cursor.fetchone()[0]
            amendments = ReportFile.objects.filter(
                cycle=cycle, kind=ReportKind.AMEND, state__in=_SENT_STATES
            ).count()
            summaries.append(
                {
                    "cycle": cycle,
                    "counts": [(label, counts[cycle.pk].get(k, 0)) for k, label in _STATUS_LABELS],
                    "open": counts[cycle.pk].get("open", 0),
                    "amendments": amendments,
                    "reported_at": reported_at,
                    "met": reported_at is not None and drop_date(reported_at) <= cycle.due_date,
                }
            )
        return summaries


# In the order of DROP's figures: complied with, denied, not found.
_STATUS_LABELS = (
    *(
        (str(status.value), f"{status.value} {status.label.lower()}")
        for statuses in METRIC_STATUSES.values()
        for status in statuses
    ),
    ("open", "no status yet"),
    ("removed", "removed by DROP"),
)
# The cycles' work items by the status DROP holds (the reported one), open or removed.
_CYCLE_COUNTS = """
SELECT cycle_id, CASE WHEN state = %s THEN 'removed'
                      WHEN reported_status_code IS NULL THEN 'open'
                      ELSE reported_status_code::text END, count(*)
FROM integrations_workitem WHERE cycle_id = ANY(%s) GROUP BY 1, 2
"""
_CYCLE_REPORTED_AT = """
SELECT max(created_at) FROM integrations_ledgerevent
WHERE broker_id = %s AND kind = 'drop_cycle.reported' AND subject = %s
"""


# ------------------------------------------------------------------ the ledger range


class _LedgerRange:
    def __init__(self, *, broker: Broker, since: dt.datetime) -> None:
        self.broker_id = broker.broker_id
        with connection.cursor() as cursor:
            ends: list[tuple[int | None, int | None]] = []
            for direction in ("ASC", "DESC"):
                cursor.execute(
                    _RANGE_END_SQL.format(direction=direction),
                    {"broker": self.broker_id, "since": since},
                )
                ends.append(cursor.fetchone() or (None, None))
            self.first, self.first_id = ends[0]
            self.last, self.last_id = ends[1]
            self.before: str | None = None
            self.after: str | None = None
            if self.first is not None:
                cursor.execute(_LINK_BEFORE, [self.first])
                row = cursor.fetchone()
                self.before = row[0] if row else GENESIS_HASH
                cursor.execute(
                    "SELECT chain_hash FROM integrations_ledgerchainlink WHERE position = %s",
                    [self.last],
                )
                self.after = cursor.fetchone()[0]
            cursor.execute(_UNSEALED_COUNT, {"broker": self.broker_id, "since": since})
            self.unsealed = cursor.fetchone()[0]
        self.since = since
        self.lines_written = 0

    def describe(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "first_event_id": self.first_id,
            "last_event_id": self.last_id,
            "first_position": self.first,
            "last_position": self.last,
            "chain_hash_before": self.before,
            "chain_hash_after": self.after,
            "unsealed_events": self.unsealed,
        }

    def lines(self) -> Iterator[bytes]:
        params = {
            "broker": self.broker_id,
            "first": self.first or 0,
            "last": self.last or -1,
            "since": self.since,
        }
        with connection.cursor() as cursor:
            for sql in (_CHAIN_LINES, _UNSEALED_LINES):
                with cursor.copy(sql, params) as copy:
                    yield from _rechunk(copy)


# The broker's first and last chained event since ``since``: the range's two ends.
_RANGE_END_SQL = """
SELECT l.position, e.id
FROM integrations_ledgerchainlink l JOIN integrations_ledgerevent e ON e.id = l.event_id
WHERE e.broker_id = %(broker)s AND e.created_at >= %(since)s
ORDER BY l.position {direction} LIMIT 1
"""
_LINK_BEFORE = """
SELECT chain_hash FROM integrations_ledgerchainlink WHERE position < %s
ORDER BY position DESC LIMIT 1
"""
_EVENT_JSON = """json_build_object(
    'position', {position}, 'id', e.id,
    'created_at', to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                  || '+00:00',
    'broker_id', e.broker_id, 'kind', e.kind, 'subject', e.subject, 'actor', e.actor,
    'data', e.data, 'event_hash', e.event_hash, 'chain_hash', {chain_hash})"""
# One JSON document per line. CSV with a quote and a delimiter that JSON never holds raw
# (it escapes control characters) writes each document unquoted and unescaped.
_COPY_LINES = "COPY ({select}) TO STDOUT WITH (FORMAT csv, QUOTE E'\\x01', DELIMITER E'\\x02')"
# Built from constants only; every value is a parameter.
_CHAIN_LINES = _COPY_LINES.format(
    select="SELECT CASE WHEN e.broker_id = %(broker)s THEN "  # noqa: S608
    + _EVENT_JSON.format(position="l.position", chain_hash="l.chain_hash")
    + " ELSE json_build_object('position', l.position, 'id', e.id, 'event_hash', e.event_hash,"
    " 'chain_hash', l.chain_hash) END"
    " FROM integrations_ledgerchainlink l JOIN integrations_ledgerevent e ON e.id = l.event_id"
    " WHERE l.position BETWEEN %(first)s AND %(last)s ORDER BY l.position"
)
# Events committed after the last seal (the snapshot sees them, the chain not yet): hashed,
# not chained.
_UNSEALED_WHERE = """
FROM integrations_ledgerevent e
WHERE e.broker_id = %(broker)s AND e.created_at >= %(since)s
  AND e.txid >= coalesce((SELECT horizon_txid FROM integrations_ledgerchainlink
                          ORDER BY position DESC LIMIT 1), 0)
  AND NOT EXISTS (SELECT 1 FROM integrations_ledgerchainlink l WHERE l.event_id = e.id)
"""
_UNSEALED_COUNT = "SELECT count(*) " + _UNSEALED_WHERE
_UNSEALED_LINES = _COPY_LINES.format(
    select="SELECT "
    + _EVENT_JSON.format(position="NULL::bigint", chain_hash="NULL::text")
    + _UNSEALED_WHERE
    + " ORDER BY e.id"
)


# ------------------------------------------------------------------ files


def _rechunk(blocks: Iterable[Any], size: int = 1 << 16) -> Iterator[bytes]:
    chunk = bytearray()
    for block in blocks:
        chunk += block
        if len(chunk) >= size:
            yield bytes(chunk)
            chunk.clear()
    if chunk:
        yield bytes(chunk)


def _report_file_content(pk: int) -> Iterator[bytes]:
    offset = 1
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT substring(content FROM %s FOR %s) FROM integrations_reportfile "
                "WHERE id = %s",
                [offset, _CONTENT_CHUNK, pk],
            )
            chunk = bytes(cursor.fetchone()[0])
            if not chunk:
                return
            yield chunk
            offset += len(chunk)


def _answer(report_file: ReportFile) -> dict[str, Any]:
    discarded = (
        {
            "discard_reason": report_file.discard_reason,
            "discarded_by": report_file.discarded_by,
            "discarded_at": report_file.discarded_at.isoformat()
            if report_file.discarded_at
            else None,
        }
        if report_file.state == ReportFileState.DISCARDED
        else {}
    )
    return {
        "cycle": report_file.cycle.drop_session_id,
        "file_name": report_file.file_name,
        "kind": report_file.kind,
        "state": report_file.state,
        "rows": report_file.rows,
        "sha256": report_file.sha256,
        "created_at": report_file.created_at.isoformat(),
        "uploaded_at": report_file.uploaded_at.isoformat() if report_file.uploaded_at else None,
        "drop_response": report_file.drop_response,
        **discarded,
    }


class _LineCounter:
    def __init__(self) -> None:
        self.rows = 0

    def feed(self, chunk: bytes) -> None:
        self.rows += chunk.count(b"\n")


class _CsvRecordCounter:
    """CSV records (header excluded) as the bytes stream by: a line end inside quotes is
    part of a cell, not the end of a record."""

    def __init__(self) -> None:
        self.records = 0
        self.quoted = False

    def feed(self, chunk: bytes) -> None:
        if b'"' not in chunk and not self.quoted:
            self.records += chunk.count(b"\n")
            return
        for index, part in enumerate(chunk.split(b'"')):
            if index:
                self.quoted = not self.quoted
            if not self.quoted:
                self.records += part.count(b"\n")

    @property
    def rows(self) -> int:
        return max(self.records - 1, 0)


class _PackWriter:
    """Writes members to ``out`` (seekable and readable: each member's stored bytes are read
    back for their digest)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.archive = zipfile.ZipFile(out, "w", compression=pack.COMPRESSION, compresslevel=1)
        self.entries: list[dict[str, Any]] = []

    def write(
        self,
        name: str,
        chunks: Iterable[bytes],
        *,
        rows: int | _LineCounter | _CsvRecordCounter | None,
        description: str | None = None,
    ) -> None:
        digest = hashlib.sha256()
        size = 0
        counter = rows if isinstance(rows, _LineCounter | _CsvRecordCounter) else None
        with self.archive.open(pack.member_info(name), "w", force_zip64=True) as member:
            for chunk in chunks:
                member.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if counter is not None:
                    counter.feed(chunk)
        self.entries.append(
            {
                "name": name,
                "description": description or DESCRIPTIONS[name],
                "sha256": digest.hexdigest(),
                "rows": counter.rows if counter is not None else rows,
                "bytes": size,
                "zip_sha256": self._stored_digest(),
            }
        )

    def _stored_digest(self) -> str:
        info = self.archive.filelist[-1]
        end = self.out.tell()
        # The local header: 30 bytes, the name, and the 20-byte ZIP64 field.
        self.out.seek(info.header_offset + 30 + len(info.filename.encode()) + 20)
        digest = hashlib.sha256()
        left = info.compress_size
        while left > 0:
            chunk = self.out.read(min(left, _CONTENT_CHUNK))
            digest.update(chunk)
            left -= len(chunk)
        self.out.seek(end)
        return digest.hexdigest()

    def write_raw(self, name: str, content: bytes) -> None:
        with self.archive.open(pack.member_info(name), "w", force_zip64=True) as member:
            member.write(content)

    def close(self) -> None:
        self.archive.close()
