"""Writing a signed evidence pack for a broker's auditors (format: ``integrations.evidence.pack``).

    result = evidence_pack_export(broker=broker, cycle=cycle, out=binary_file,
                                  actor="cli:alice", via="command")
    result = evidence_pack_export(broker=broker, since=start, until=end, out=..., ...)
    result = evidence_pack_export(..., sample=20, seed="auditor-2028")   # and 20 stories

The pack is laid out by the audit's components (``integrations.evidence.components``): inside
the snapshot every builder of ``components.BUILDERS`` runs in the audit's order and its
tests go into ``components.json`` and one section each of ``summary.html``.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.template.loader import render_to_string
from django.utils import timezone

from integrations.drop.calendar import drop_timezone
from integrations.evidence import components as layout
from integrations.evidence import pack
from integrations.evidence.signing_key import evidence_signing_key
from integrations.ledger_hash import canonical_json
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropCycle
from integrations.services.evidence.anchors import write_anchors
from integrations.services.evidence.components import BUILDERS
from integrations.services.evidence.components.base import Component, PackContext
from integrations.services.evidence.evidence_ledger import LedgerRange
from integrations.services.evidence.evidence_period import (
    Period,
    report_file_answer,
    report_file_content,
)
from integrations.services.evidence.evidence_sample import (
    SAMPLE_MAX,
    Sample,
    sample_draw,
    sample_pages_write,
    sample_population_write,
)
from integrations.services.evidence.evidence_writer import CsvRecordCounter, LineCounter, PackWriter
from integrations.services.ledger import ledger_event_append, ledger_seal


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
    sample: int | None = None,
    seed: str | None = None,
    in_place: Callable[[], None] | None = None,
) -> EvidenceExport:
    """Write the pack of ``cycle``, or of ``since``..``until`` (until exclusive), to ``out``;
    with ``sample`` and ``seed``, that many work items' stories drawn by the seed.

    ``in_place`` (the command's rename of the written file to its name) runs in the
    transaction that appends the export's event, after it: when it fails, the event is
    rolled back, so the ledger never records a pack that was not written."""
    _check_pack_period(broker=broker, cycle=cycle, since=since, until=until)
    _check_sample(sample, seed)
    key = evidence_signing_key()
    ledger_seal()
    exported_at = timezone.now()
    with _snapshot():
        writer = PackWriter(out)
        period = Period(broker=broker, cycle=cycle, since=since, until=until)
        writer.write(pack.OUTCOMES, period.outcome_chunks(), rows=CsvRecordCounter())
        span = LedgerRange(broker=broker, since=period.ledger_since())
        writer.write(pack.LEDGER, span.lines(), rows=LineCounter())
        anchors = write_anchors(writer, span)
        _write_report_files(writer, period)
        context = PackContext(broker=broker, period=period, writer=writer, exported_at=exported_at)
        components = _components_build(context)
        writer.write(
            layout.FILE,
            [json.dumps(_components_document(components), indent=2).encode() + b"\n"],
            rows=None,
        )
        drawn = None
        if sample is not None and seed is not None:
            drawn = sample_draw(period=period, size=sample, seed=seed)
            sample_population_write(writer, period)
            sample_pages_write(writer, drawn, exported_at=exported_at)
        with timezone.override(dt.UTC):  # an export says UTC, whatever zone staff read in
            summary = render_to_string(
                "evidence/summary.html",
                {
                    "broker": broker,
                    # The cycles' times beside their due dates, in the due dates' calendar.
                    "drop_timezone": drop_timezone(),
                    "period": period.describe(),
                    "exported_at": exported_at,
                    "cycles": context.cycle_summaries,
                    "span": span.describe(),
                    "files": writer.entries,
                    "requests_open": period.requests_open(),
                    "components": [_component_section(c) for c in components.values()],
                    "sample": drawn,
                    "anchors": anchors,
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
        components=components,
        sample=drawn,
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
                "components": manifest["components"]["results"],
                **(
                    {"sample": {k: manifest["sample"][k] for k in ("seed", "size", "drawn")}}
                    if drawn is not None
                    else {}
                ),
            },
        )
        if in_place is not None:
            in_place()
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


def _check_sample(sample: int | None, seed: str | None) -> None:
    if (sample is None) != (seed is None):
        raise ValidationError("give --sample and --seed together")
    if sample is not None and not 1 <= sample <= SAMPLE_MAX:
        raise ValidationError(f"--sample must be 1 to {SAMPLE_MAX:,} work items")
    if seed is not None and not seed.strip():
        raise ValidationError("--seed must not be empty")


def _components_build(context: PackContext) -> dict[str, Component]:
    """Every component in the audit's order; one this version has no builder for is there
    too, failed, so a pack never leaves one out without saying so."""
    built: dict[str, Component] = {}
    for key in layout.KEYS:
        builder = BUILDERS.get(key)
        if builder is not None:
            built[key] = builder(context)
            continue
        missing = Component(
            key=key,
            proves="Nothing: this version of the service does not build this component.",
            cannot_prove="Anything about this component; test it by other means.",
        )
        missing.test("a builder for this component", passed=False, detail=_NO_BUILDER)
        built[key] = missing
    return built


_NO_BUILDER = "no builder registered in this version"


def _component_section(component: Component) -> dict[str, Any]:
    """A component as ``summary.html`` shows it: its records as readable pairs."""
    return {
        **component.as_json(),
        "key": component.key,
        "records": [
            (name, value if isinstance(value, str | int | float) else json.dumps(value))
            for name, value in component.records.items()
        ],
    }


def _components_document(components: dict[str, Component]) -> dict[str, Any]:
    return {
        "format": layout.FORMAT,
        "components": {key: component.as_json() for key, component in components.items()},
    }


def _write_report_files(writer: PackWriter, period: Period) -> None:
    """Each response file of the period exactly as sent to DROP, and DROP's answer to it."""
    for report_file in period.report_files():
        name = f"{pack.DROP_DIR}{report_file.cycle.drop_session_id}/{report_file.file_name}"
        writer.write(
            name,
            report_file_content(report_file.pk),
            rows=report_file.rows,
            description=f"response file ({report_file.kind}) exactly as sent to DROP",
        )
        writer.write(
            name + pack.ANSWER_SUFFIX,
            [canonical_json(report_file_answer(report_file)).encode() + b"\n"],
            rows=1,
            description="DROP's answer to it",
        )


def _manifest(
    *,
    broker: Broker,
    period: Period,
    span: LedgerRange,
    exported_at: dt.datetime,
    actor: str,
    key: Ed25519PrivateKey,
    files: list[dict[str, Any]],
    components: dict[str, Component],
    sample: Sample | None,
) -> dict[str, Any]:
    """What the pack holds and who made it, signed with ``key``."""
    return {
        "format": pack.FORMAT,
        # The broker's mode at the export; each cycle's own is in the summary.
        "broker": {"broker_id": broker.broker_id, "name": broker.name, "mode": broker.mode},
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
        # The verifier holds components.json to these, and requires it when they are here.
        "components": {
            "file": layout.FILE,
            "results": {key: c.as_json()["result"] for key, c in components.items()},
        },
        **({"sample": sample.as_json()} if sample is not None else {}),
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
