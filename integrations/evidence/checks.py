"""An evidence pack's checks after its archive's bytes: the manifest's signature, every
file's digest and row count, the ledger chain over the range, that every outcome row
and every status in the DROP files has its ledger events, and that ``components.json``
holds together (each audit component present, its result the one its tests give, every file
it names in the pack; a pack from before the components has none, accepted only when the
auditor allows it, and the checks say so)::

    result = Verification(ok=False)
    PackChecker(raw, archive, public_key_pem, result).run()   # raises PackInvalid
    result.checks                                             # what held, in order

No Django and no database: ``verify`` runs these from a plain checkout.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import struct
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature

from integrations.evidence import components as layout
from integrations.evidence import pack
from integrations.evidence import sample as drawing
from integrations.evidence.archive import PackInvalid, check_structure
from integrations.evidence.timestamps import PackAnchors
from integrations.ledger_hash import chain_hash, event_hash
from integrations.ledger_kinds import LedgerKind
from integrations.url_extras import data_without_url_extras

if TYPE_CHECKING:
    from cryptography import x509

_READ_CHUNK = 1 << 20
_MANIFEST_MAX = 64 << 20
# What reading a damaged member raises (zlib's own error for a broken deflate stream).
_DAMAGED = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError)


@dataclass
class Verification:
    ok: bool
    failure: str | None = None
    checks: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    key_fingerprint: str = ""
    key_trusted: bool = False
    # The audit's components and their results (None: a pack from before them).
    components: dict[str, dict[str, Any]] | None = None

    @property
    def components_failed(self) -> list[str]:
        """The components whose tests failed at export: the pack is authentic, the system
        it records failed those tests."""
        return [
            key
            for key, component in (self.components or {}).items()
            if component["result"] != layout.PASS
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failure": self.failure,
            "checks": self.checks,
            "broker": self.manifest.get("broker"),
            "period": self.manifest.get("period"),
            "ledger_range": self.manifest.get("ledger_range"),
            "key_fingerprint": self.key_fingerprint,
            "key_trusted": self.key_trusted,
            # Said plainly for automation: without a key of the auditor's own, a valid
            # signature proves the pack is whole, not that the service signed it.
            "signer_checked": self.key_trusted,
            "components": self.components,
            "components_failed": self.components_failed,
            "sample": self.manifest.get("sample"),
        }


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


class PackChecker:
    def __init__(
        self,
        raw: IO[bytes],
        archive: zipfile.ZipFile,
        public_key_pem: bytes | None,
        result: Verification,
        tsa_certificates: list[x509.Certificate] | None = None,
        *,
        allow_pre_components: bool = False,
        allow_pre_population: bool = False,
    ) -> None:
        self.raw, self.archive, self.result = raw, archive, result
        self.allow_pre_components = allow_pre_components
        self.allow_pre_population = allow_pre_population
        self.public_key_pem = public_key_pem
        self.tsa_certificates = tsa_certificates
        self.anchors = PackAnchors([], self.read_member)
        self.files: dict[str, dict[str, Any]] = {}
        self.stored_data: dict[str, tuple[int, int]] = {}
        # What the ledger holds, for the cross-checks (digests keep memory small).
        self.cycles_imported: dict[str, int] = {}
        self.outcomes_recorded: set[bytes] = set()
        self.item_statuses: set[bytes] = set()
        self.file_events: set[bytes] = set()
        # The ledger events the matching files cite (id: kind), and those the ledger holds
        # (id: kind, None when given as a hash only); the cycles the records are of.
        self.cited: dict[int, str] = {}
        self.cited_found: dict[int, str | None] = {}
        self.record_cycles: set[str] = set()
        # With a sample's population: the work items the records name, each of which the
        # population must hold (a key holder could otherwise leave some out to steer the draw).
        self.reported_items: set[bytes] | None = None

    def check(self, text: str) -> None:
        self.result.checks.append(text)

    def run(self) -> None:
        try:
            self.stored_data = check_structure(self.raw, self.archive)
        except (struct.error, ValueError, OSError, UnicodeError) as exc:
            raise PackInvalid(f"the archive is damaged: {exc}") from None
        self.check("archive structure: every byte accounted for")
        manifest = self.signed_manifest()
        self.check_digests(manifest)
        self.anchors = PackAnchors.read(self.read_member, set(self.files))
        self.cited = self.rematch_citations()
        sample = manifest.get("sample")
        if isinstance(sample, dict) and sample.get("population_file") is not None:
            self.reported_items = set()
        self.check_ledger(manifest)
        self.check(self.anchors.check(self.tsa_certificates))
        self.check_outcomes()
        self.check_drop_files()
        self.check_components(manifest)
        self.check_sample(manifest)

    def read_member(self, name: str, limit: int) -> bytes:
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            raise PackInvalid(f"{name} is missing") from None
        if info.file_size > limit:
            raise PackInvalid(f"{name} is too large ({info.file_size} bytes)")
        try:
            return self.archive.read(info)
        except _DAMAGED as exc:
            raise PackInvalid(f"{name} is damaged: {exc}") from None

    def signed_manifest(self) -> dict[str, Any]:
        manifest_bytes = self.read_member(pack.MANIFEST, _MANIFEST_MAX)
        signature = self.read_member(pack.SIGNATURE, 4096)
        try:
            manifest = pack.json_read(manifest_bytes)
        except ValueError as exc:
            raise PackInvalid(f"{pack.MANIFEST} is not JSON: {exc}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != pack.FORMAT:
            raise PackInvalid(f"{pack.MANIFEST} is not a {pack.FORMAT} manifest")
        trusted = self.public_key_pem is not None
        enclosed = manifest.get("signing_key")
        if not trusted and not (
            isinstance(enclosed, dict) and isinstance(enclosed.get("public_key"), str)
        ):
            raise PackInvalid(f"{pack.MANIFEST}: signing_key has no public_key string")
        try:
            key = pack.load_public_key(
                self.public_key_pem
                if self.public_key_pem is not None
                else manifest["signing_key"]["public_key"]
            )
        except ValueError as exc:
            raise PackInvalid(f"the public key: {exc}") from None
        fingerprint = pack.key_fingerprint(key)
        try:
            pack.verify_manifest(key, manifest_bytes, signature)
        except (InvalidSignature, ValueError):
            raise PackInvalid(
                f"{pack.MANIFEST}'s signature does not verify with the "
                f"{'given' if trusted else 'enclosed'} public key (SHA-256 {fingerprint[:16]}…)"
            ) from None
        # Anyone can sign a manifest with a key of their own and enclose it: what the checks
        # read of it is held to its shape, so a malformed one is a failure, not a crash.
        problem = _manifest_shape_problem(manifest)
        if problem:
            raise PackInvalid(f"{pack.MANIFEST}: {problem}")
        self.result.manifest = manifest
        self.result.key_fingerprint = fingerprint
        self.result.key_trusted = trusted
        self.check(
            f"signature: valid, key SHA-256 {fingerprint[:16]}… "
            + ("(the key given)" if trusted else "(the key in the pack: pass --public-key)")
        )
        return manifest

    def check_digests(self, manifest: dict[str, Any]) -> None:
        for entry in manifest["files"]:
            if entry["name"] in self.files:
                raise PackInvalid(f"{pack.MANIFEST} lists {entry['name']} twice")
            self.files[entry["name"]] = entry
        present = set(self.archive.namelist()) - {pack.MANIFEST, pack.SIGNATURE}
        for name in sorted(present - set(self.files)):
            raise PackInvalid(f"{name} is in the pack but not in the manifest")
        for name in sorted(set(self.files) - present):
            raise PackInvalid(f"{name} is in the manifest but not in the pack")
        for name, entry in self.files.items():
            digest = hashlib.sha256()
            for chunk in self.chunks(name):
                digest.update(chunk)
            if digest.hexdigest() != entry.get("sha256"):
                raise PackInvalid(f"{name}: its SHA-256 does not match the manifest")
            if self.stored_digest(name) != entry.get("zip_sha256"):
                raise PackInvalid(f"{name}: its compressed bytes do not match the manifest")
        self.check(f"digests: {len(self.files)} files match the manifest")

    def stored_digest(self, name: str) -> str:
        """SHA-256 of a member's bytes as stored (compressed): deflate leaves bits that do not
        change what comes out, and they are part of the pack too."""
        start, length = self.stored_data[name]
        digest = hashlib.sha256()
        self.raw.seek(start)
        while length > 0:
            chunk = self.raw.read(min(length, _READ_CHUNK))
            if not chunk:
                raise PackInvalid(f"{name} is cut short")
            digest.update(chunk)
            length -= len(chunk)
        return digest.hexdigest()

    def chunks(self, name: str) -> Iterator[bytes]:
        try:
            with self.archive.open(name) as member:
                while chunk := member.read(_READ_CHUNK):
                    yield chunk
        except _DAMAGED as exc:
            raise PackInvalid(f"{name} is damaged: {exc}") from None

    def lines(self, name: str) -> Iterator[str]:
        text = io.TextIOWrapper(
            io.BufferedReader(_ChunkReader(self.chunks(name))), encoding="utf-8", newline=""
        )
        try:
            yield from text
        except UnicodeDecodeError as exc:
            raise PackInvalid(f"{name} is not UTF-8: {exc}") from None

    def rows_match(self, name: str, rows: int) -> None:
        declared = self.files[name].get("rows")
        if not pack.whole_number(declared) or declared != rows:
            raise PackInvalid(
                f"{name}: {rows} rows, the manifest says {self.files[name].get('rows')}"
            )

    # -- the ledger

    def check_ledger(self, manifest: dict[str, Any]) -> None:
        broker_id = manifest["broker"]["broker_id"]
        span = manifest["ledger_range"]
        previous = span.get("chain_hash_before")
        last_position = 0
        first_id: int | None = None
        last_id: int | None = None
        count = full = unsealed = 0
        for count, line in enumerate(self.lines(pack.LEDGER), start=1):
            where = f"{pack.LEDGER} line {count}"
            try:
                event = pack.json_read(line)
                position, event_id = event["position"], event["id"]
                stored_hash = str(event["event_hash"])
                if not pack.whole_number(event_id):
                    raise ValueError(f"its id {event_id!r} is not an integer")
            except (ValueError, KeyError, TypeError) as exc:
                raise PackInvalid(f"{where}: not a ledger line ({exc})") from None
            # Only the broker's own events, given in full, show their time.
            shown_at: dt.datetime | None = None
            if "kind" in event:
                full += 1
                shown_at = self.event_content(event, broker_id, where, stored_hash)
            if event_id in self.cited:
                self.cited_found[event_id] = str(event["kind"]) if "kind" in event else None
            if event.get("chain_hash") is None:
                unsealed += 1  # written after the last seal: hashed, not yet chained
                continue
            if unsealed:
                raise PackInvalid(f"{where}: a chained event after an unsealed one")
            if not pack.whole_number(position):
                raise PackInvalid(f"{where}: its position {position!r} is not an integer")
            if position <= last_position:
                raise PackInvalid(f"{where}: chain positions must increase")
            last_position = position
            first_id = event_id if first_id is None else first_id
            last_id = event_id
            previous = chain_hash(str(previous), event_id, stored_hash)
            if previous != event["chain_hash"]:
                raise PackInvalid(f"{where}: event {event_id}'s chain hash does not match")
            self.anchors.chain_hash_seen(position, event_id, previous, created_at=shown_at)
        self.rows_match(pack.LEDGER, count)
        if (first_id, last_id) != (span.get("first_event_id"), span.get("last_event_id")):
            raise PackInvalid(
                f"{pack.LEDGER}: the chain runs from event {first_id} to {last_id}, the manifest "
                f"says {span.get('first_event_id')} to {span.get('last_event_id')}"
            )
        if previous != span.get("chain_hash_after"):
            raise PackInvalid(f"{pack.LEDGER}: the chain does not end on the manifest's hash")
        self.check(
            f"ledger: {count} chain links recomputed from event {first_id} to {last_id}, "
            f"{full} of broker {broker_id} in full"
            + (
                f", {unsealed} written after the last seal (hashed, not chained)"
                if unsealed
                else ""
            )
        )

    def event_content(
        self, event: dict[str, Any], broker_id: str, where: str, stored_hash: str
    ) -> dt.datetime:
        """The event's content held to its hash and read for the cross-checks; its time."""
        try:
            created_at = pack.aware_time(event["created_at"], "created_at")
            recomputed = event_hash(
                created_at=created_at,
                broker_id=event["broker_id"],
                kind=event["kind"],
                subject=event["subject"],
                actor=event["actor"],
                data=event["data"],
            )
        # OverflowError: a time that is no time in UTC (year 9999 west of it, year 1 east).
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            raise PackInvalid(f"{where}: not a ledger event ({exc})") from None
        if recomputed != stored_hash:
            raise PackInvalid(f"{where}: event {event['id']}'s content does not match its hash")
        if event["broker_id"] != broker_id:
            raise PackInvalid(f"{where}: event {event['id']} of another broker given in full")
        kind, data, subject = event["kind"], event["data"], event["subject"]
        if not isinstance(kind, str) or not isinstance(data, dict):
            return created_at  # not one the cross-checks read: they then miss its record
        if kind == LedgerKind.DROP_CYCLE_IMPORTED:
            not_found = data.get("not_found") or 0
            if not pack.whole_number(not_found):
                raise PackInvalid(f"{where}: event {event['id']}'s not_found is not a number")
            self.cycles_imported[str(data.get("drop_session_id"))] = not_found
        elif kind == LedgerKind.DELETION_REQUEST_OUTCOME_RECORDED:
            self.outcomes_recorded.add(_digest(f"{subject}|{data.get('drop_outcome')}"))
        elif kind in (LedgerKind.WORK_ITEM_STATUS_SETTLED, LedgerKind.WORK_ITEM_STATUS_SET):
            self.item_statuses.add(
                _digest(f"{data.get('cycle')}|{subject}|{data.get('status_code')}")
            )
        elif kind.startswith("report_file."):
            self.file_events.add(
                _digest(
                    f"{kind}|{data.get('cycle')}|{data.get('file_name')}|{data.get('kind')}|"
                    f"{data.get('sha256')}|{data.get('rows')}"
                )
            )
            if "drop_response" in data:
                self.file_events.add(
                    _digest(
                        f"{kind}|{data.get('cycle')}|{data.get('file_name')}|"
                        + json.dumps(data["drop_response"], sort_keys=True)
                    )
                )
        return created_at

    # -- the cross-checks

    def check_outcomes(self) -> None:
        reader = csv.DictReader(self.lines(pack.OUTCOMES))
        try:
            self.outcome_rows(reader)
        except csv.Error as exc:
            raise PackInvalid(f"{pack.OUTCOMES}: not CSV ({exc})") from None

    def outcome_rows(self, reader: csv.DictReader[str]) -> None:
        rows = 0
        needed = {"request_uuid", "drop_session_id", "drop_outcome"}
        if not needed <= set(reader.fieldnames or ()):
            raise PackInvalid(f"{pack.OUTCOMES}: the columns {sorted(needed)} are missing")
        for rows, row in enumerate(reader, start=1):
            where = f"{pack.OUTCOMES} row {rows} (request {row['request_uuid']})"
            self.record_cycles.add(row["drop_session_id"])
            if self.reported_items is not None and row.get("work_item_id"):
                self.reported_items.add(_digest(f"{row['drop_session_id']}|{row['work_item_id']}"))
            if row["drop_session_id"] not in self.cycles_imported:
                raise PackInvalid(
                    f"{where}: cycle {row['drop_session_id']} has no drop.cycle_imported event"
                )
            outcome = row["drop_outcome"]
            if (
                outcome
                and _digest(f"{row['request_uuid']}|{outcome}") not in self.outcomes_recorded
            ):
                raise PackInvalid(
                    f"{where}: its outcome {outcome!r} has no "
                    "deletion_request.outcome_recorded event"
                )
        self.rows_match(pack.OUTCOMES, rows)
        self.check(f"outcomes: {rows} rows, each with its cycle's and its outcome's events")

    def check_drop_files(self) -> None:
        files = answers = 0
        unmatched: Counter[str] = Counter()
        for name in sorted(self.files):
            if not name.startswith(pack.DROP_DIR) or name.endswith(pack.ANSWER_SUFFIX):
                continue
            files += 1
            parts = name.split("/")
            if len(parts) != 3:
                raise PackInvalid(f"{name}: not drop/<cycle>/<file>")
            cycle, file_name = parts[1], parts[2]
            self.record_cycles.add(cycle)
            answer = self.answer(name)
            answers += 1
            if cycle not in self.cycles_imported:
                raise PackInvalid(f"{name}: cycle {cycle} has no drop.cycle_imported event")
            rows = without_event = 0
            # Held to its report_file.written event below, with the file's digest and rows.
            kind = answer.get("kind")
            for line_number, line in enumerate(self.lines(name), start=1):
                if line_number == 1:
                    continue  # the header
                work_item_id, _, status = line.rstrip("\r\n").partition(",")
                rows += 1
                if self.reported_items is not None:
                    self.reported_items.add(_digest(f"{cycle}|{work_item_id}"))
                if _digest(f"{cycle}|{work_item_id}|{status}") in self.item_statuses:
                    continue
                # A work item the import found no match for has its status 5 without an
                # event of its own (drop.cycle_imported counts them), and DROP first gets it
                # in an upload; an amendment's status is always a change an event records.
                if status != "5" or kind != "upload":
                    raise PackInvalid(
                        f"{name} line {line_number}: status {status} of work item "
                        f"{work_item_id} has no work_item event"
                    )
                without_event += 1
            self.rows_match(name, rows)
            sha256 = self.files[name].get("sha256")
            if _digest(f"report_file.written|{cycle}|{file_name}|{kind}|{sha256}|{rows}") not in (
                self.file_events
            ):
                raise PackInvalid(
                    f"{name}: no report_file.written event with its kind, digest and rows"
                )
            # Each upload on its own, whatever DROP answered; the cycle's total counts only
            # those DROP took (a rejected file's rows are sent again in another).
            if without_event > self.cycles_imported[cycle]:
                raise PackInvalid(
                    f"{name}: {without_event} statuses 5 without a work_item event, the import "
                    f"found {self.cycles_imported[cycle]} work items without a match"
                )
            if answer.get("state") in ("accepted", "manual"):
                unmatched[cycle] += without_event
            self.check_answer(name, cycle, file_name, answer)
        for cycle, count in sorted(unmatched.items()):
            if count > self.cycles_imported[cycle]:
                raise PackInvalid(
                    f"cycle {cycle}: {count} statuses 5 without a work_item event, the import "
                    f"found {self.cycles_imported[cycle]} work items without a match"
                )
        self.check(
            f"DROP files: {files} response files and {answers} answers, each status and file "
            "with its ledger events"
        )

    def answer(self, name: str) -> dict[str, Any]:
        answer_name = name + pack.ANSWER_SUFFIX
        if answer_name not in self.files:
            raise PackInvalid(f"{name}: DROP's answer ({answer_name}) is missing")
        try:
            answer = pack.json_read(self.read_member(answer_name, _MANIFEST_MAX))
        except ValueError as exc:
            raise PackInvalid(f"{answer_name} is not JSON: {exc}") from None
        self.rows_match(answer_name, 1)
        return answer if isinstance(answer, dict) else {}

    def check_answer(self, name: str, cycle: str, file_name: str, answer: dict[str, Any]) -> None:
        state = answer.get("state")
        facts = f"{answer.get('kind')}|{self.files[name].get('sha256')}|"
        facts += f"{self.files[name].get('rows')}"
        if state == "manual":
            expected = f"report_file.marked_uploaded|{cycle}|{file_name}|{facts}"
        elif state in ("accepted", "rejected"):
            # The ledger keeps DROP's answer with every URL cut to its scheme, host and path
            # (tokens travel in queries); the file keeps it as DROP sent it.
            expected = f"report_file.{state}|{cycle}|{file_name}|" + json.dumps(
                data_without_url_extras(answer.get("drop_response")), sort_keys=True
            )
        elif state in ("refused", "discarded"):
            # DROP's refusal is retried (its answer on the file changes); the event that
            # made the file refused, or staff's discard, names the file's digest and rows.
            expected = f"report_file.{state}|{cycle}|{file_name}|{facts}"
        else:
            raise PackInvalid(f"{name}: DROP's answer has no state a sent file has ({state!r})")
        if _digest(expected) not in self.file_events:
            raise PackInvalid(f"{name}: DROP's answer ({state}) has no matching ledger event")

    # -- the audit's components and the sample

    def check_components(self, manifest: dict[str, Any]) -> None:
        declared = manifest.get("components")
        if layout.FILE not in self.files:
            if declared is not None:
                raise PackInvalid(f"{layout.FILE} is missing, the manifest declares it")
            # A pack without it looks like an older one, but a key holder can make any pack
            # look so (delete the components, sign again): only the auditor, who knows the
            # pack's age, may accept it.
            if not self.allow_pre_components:
                raise PackInvalid(
                    f"{layout.FILE} is missing (a pack exported before packs were laid out by "
                    "the audit's components verifies with --allow-pre-components)"
                )
            self.check(
                f"components: none ({layout.FILE} is not in this pack: it was exported before "
                "packs were laid out by the audit's components)"
            )
            return
        try:
            document = pack.json_read(self.read_member(layout.FILE, _MANIFEST_MAX))
        except ValueError as exc:
            raise PackInvalid(f"{layout.FILE} is not JSON: {exc}") from None
        problems = layout.component_problems(document, set(self.files))
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise PackInvalid(problems[0] + more)
        components: dict[str, dict[str, Any]] = document["components"]
        results = {key: component["result"] for key, component in components.items()}
        if declared is not None and declared.get("results") != results:
            raise PackInvalid(f"{layout.FILE}: its results are not the manifest's")
        self.check_vectors(components)
        self.check_matching(components["matching"])
        self.result.components = {
            key: {
                "title": component.get("title", key),
                "result": component["result"],
                "failed_tests": [
                    {"name": test.get("name"), "detail": test.get("detail")}
                    for test in component["tests"]
                    if test.get("result") != layout.PASS
                ],
            }
            for key, component in components.items()
        }
        failed = self.result.components_failed
        self.check(
            f"components: all {len(components)} present, each result the one its tests give"
            + (f"; failed their tests: {', '.join(failed)}" if failed else "; all passed")
        )
        for key, component in self.result.components.items():
            if component["result"] == layout.PASS:
                self.check(f"component {key}: pass")
                continue
            self.check(
                f"component {key}: FAIL ("
                + "; ".join(f"{t['name']}: {t['detail']}" for t in component["failed_tests"])
                + ")"
            )

    def check_vectors(self, components: dict[str, dict[str, Any]]) -> None:
        """Each vectors file's values compared here: a component's pass is re-checked
        against its own records, not taken from it."""
        for key, component in components.items():
            for name in component.get("files") or []:
                if not name.endswith(layout.VECTORS_SUFFIX):
                    continue
                try:
                    document = pack.json_read(self.read_member(name, _MANIFEST_MAX))
                except ValueError as exc:
                    raise PackInvalid(f"{name} is not JSON: {exc}") from None
                problems = layout.vector_problems(key, component, name, document)
                if problems:
                    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                    raise PackInvalid(problems[0] + more)
                self.check(
                    f"{name}: {len(document['vectors'])} vectors, each result compared "
                    "again from its expected and computed values"
                )

    def rematch_citations(self) -> dict[int, str]:
        """The ledger events the matching files cite, read before the ledger so that only
        those are kept of it (the files are checked with the components)."""
        cited: dict[int, str] = {}
        for name in sorted(self.files):
            if name.startswith(layout.MATCHING_DIR) and name.endswith(".json"):
                try:
                    document = pack.json_read(self.read_member(name, _MANIFEST_MAX))
                except ValueError:
                    continue  # said when the component is checked
                cited |= layout.rematch_problems(name, document)[1]
        return cited

    def check_matching(self, component: dict[str, Any]) -> None:
        """Each matching file re-checked, not trusted: its result is what its counts give,
        each explained difference cites an event the ledger holds (of that kind), and a
        component that says pass has a passing file for every cycle the records are of."""
        files = [
            name
            for name in component.get("files") or []
            if name.startswith(layout.MATCHING_DIR) and name.endswith(".json")
        ]
        passed = component.get("result") == layout.PASS
        for name in files:
            try:
                document = pack.json_read(self.read_member(name, _MANIFEST_MAX))
            except ValueError as exc:
                raise PackInvalid(f"{name} is not JSON: {exc}") from None
            problems, cited = layout.rematch_problems(name, document)
            if passed and not problems and document["result"] != layout.PASS:
                problems.append(f"{layout.FILE}: matching says 'pass' but {name} says 'fail'")
            for event_id, kind in sorted(cited.items()):
                if event_id not in self.cited_found:
                    problems.append(f"{name} cites ledger event {event_id}, not in the pack")
                elif self.cited_found[event_id] not in (None, kind):
                    problems.append(
                        f"{name} cites ledger event {event_id} as {kind}, the ledger has "
                        f"{self.cited_found[event_id]}"
                    )
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                raise PackInvalid(problems[0] + more)
        if passed:
            named = {name.removeprefix(layout.MATCHING_DIR).removesuffix(".json") for name in files}
            for cycle in sorted(self.record_cycles - named):
                raise PackInvalid(
                    f"{layout.FILE}: matching says 'pass' without a matching file of cycle {cycle}"
                )
        self.check(
            f"matching: {len(files)} cycle files, each result the one its counts give and "
            "each explained difference's event in the ledger"
        )

    def check_sample(self, manifest: dict[str, Any]) -> None:
        sample = manifest.get("sample")
        if sample is None:
            return
        items = sample.get("work_items") if isinstance(sample, dict) else None
        if not isinstance(items, list):
            raise PackInvalid(f"{pack.MANIFEST}: the sample lists no work items")
        for item in items:
            name = str(item.get("file")) if isinstance(item, dict) else ""
            if name not in self.files:
                raise PackInvalid(f"sample: {name or 'an item'} is not in the pack")
        if sample.get("population_file") is None:
            # A key holder can strip the population to make a swapped sample look old: only
            # the auditor, who knows the pack's age, may accept a draw not checked again.
            if not self.allow_pre_population:
                raise PackInvalid(
                    f"sample: the pack does not carry the population it was drawn from (a pack "
                    f"exported before it did, without {drawing.POPULATION}, verifies with "
                    "--allow-pre-population)"
                )
            self.check(
                f"sample: {len(items)} stories drawn with seed {sample.get('seed')!r}, each "
                f"page as exported; not drawn again ({drawing.POPULATION} is not in this pack: "
                "it was exported before packs carried it)"
            )
            return
        population = self.redraw_sample(sample)
        self.check(
            f"sample: {len(items)} stories drawn with seed {sample.get('seed')!r}, each page "
            f"as exported; drawn again from the {population} work items of "
            f"{drawing.POPULATION}, the same items in the same order"
        )

    def redraw_sample(self, sample: dict[str, Any]) -> int:
        """The sample drawn again from the pack's population by its seed: the manifest's
        items, pages and counts must be what the draw gives. The population's size."""
        name, seed, size = sample.get("population_file"), sample.get("seed"), sample.get("size")
        if name != drawing.POPULATION or name not in self.files:
            raise PackInvalid(f"sample: its population file {name!r} is not in the pack")
        if not isinstance(seed, str) or not isinstance(size, int) or isinstance(size, bool):
            raise PackInvalid(f"{pack.MANIFEST}: the sample's seed or size is malformed")
        if size < 1:
            raise PackInvalid(f"{pack.MANIFEST}: the sample's seed or size is malformed")
        rows = 0

        def population() -> Iterator[tuple[str, str]]:
            nonlocal rows
            reader = csv.reader(self.lines(drawing.POPULATION))
            if next(reader, None) != list(drawing.POPULATION_COLUMNS):
                raise PackInvalid(
                    f"{drawing.POPULATION}: its columns are not "
                    f"{','.join(drawing.POPULATION_COLUMNS)}"
                )
            for rows, row in enumerate(reader, start=1):
                if len(row) != len(drawing.POPULATION_COLUMNS):
                    raise PackInvalid(f"{drawing.POPULATION} row {rows}: not cycle,work_item_id")
                if self.reported_items is not None:
                    self.reported_items.discard(_digest(f"{row[0]}|{row[1]}"))
                yield row[0], row[1]

        try:
            drawn = drawing.redraw(population(), seed=seed, size=size)
        except csv.Error as exc:
            raise PackInvalid(f"{drawing.POPULATION}: not CSV ({exc})") from None
        self.rows_match(drawing.POPULATION, rows)
        if self.reported_items:
            raise PackInvalid(
                f"sample: {len(self.reported_items)} work items of {pack.OUTCOMES} or the DROP "
                f"files are not in {drawing.POPULATION}, the population it is drawn from"
            )
        if sample.get("population") != rows:
            raise PackInvalid(
                f"sample: the manifest says a population of {sample.get('population')}, "
                f"{drawing.POPULATION} holds {rows}"
            )
        listed = [
            (item.get("cycle"), item.get("work_item_id"), item.get("file"))
            for item in sample["work_items"]
        ]
        expected = [
            (cycle, work_item_id, page)
            for (cycle, work_item_id), page in zip(drawn, drawing.page_names(drawn), strict=True)
        ]
        if sample.get("drawn") != len(listed) or listed != expected:
            wrong = next(
                (
                    f"work item {have[1]} of cycle {have[0]}"
                    for have, want in zip(listed, expected, strict=False)
                    if have != want
                ),
                f"{len(listed)} items",
            )
            raise PackInvalid(
                f"sample: seed {seed!r} does not draw {wrong} from {drawing.POPULATION} "
                f"(it draws {len(expected)} items, the first "
                f"{', '.join(w for _, w, _ in expected[:3])})"
            )
        return rows


def _manifest_shape_problem(manifest: dict[str, Any]) -> str | None:
    """What is not the shape the checks read in a manifest (None when all is): the broker
    and the ledger range objects, the broker's id, the files a list of objects each named,
    the components an object when there."""
    for key in ("broker", "ledger_range"):
        if not isinstance(manifest.get(key), dict):
            return f"{key} is not an object"
    if not isinstance(manifest["broker"].get("broker_id"), str):
        return "broker has no broker_id string"
    files = manifest.get("files")
    if not isinstance(files, list):
        return "files is not a list"
    for number, entry in enumerate(files, start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return f"files entry {number} is not an object with a name string"
    if manifest.get("components") is not None and not isinstance(manifest["components"], dict):
        return "components is not an object"
    return None


class _ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (for ``io.TextIOWrapper``)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size
