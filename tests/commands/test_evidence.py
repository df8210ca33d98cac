"""``evidence export|verify|public-key``: a signed pack that an auditor checks offline.

The pack is exported from a cycle taken through the services (``tests/evidence_world.py``);
each way of tampering with it (a byte anywhere, a ledger line, another key, records that
lost their events and were signed anyway) must fail with its reason.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import CommandError, call_command
from django.utils import timezone

from devtools.drop_simulator import DropSimulator
from dropportal import local_state
from integrations.drop.client import DropClient
from integrations.evidence import pack, verify
from integrations.evidence.verify import verify_pack
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    DropCycle,
    LedgerEvent,
    ReportFile,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.evidence.evidence import evidence_signing_key
from integrations.services.ledger import ledger_event_append
from integrations.services.reporting.report_manual import report_file_discard
from integrations.services.reporting.reports import report_run
from tests.evidence_world import DROP_KEY, evidence_world

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path) -> Iterator[DropCycle]:
    with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
        yield evidence_world(broker, drop, tmp_path)


def _export(cycle: DropCycle, out: Path) -> Path:
    call_command(
        "evidence", "export", "--broker", "4821", "--cycle", cycle.drop_session_id,
        "--out", str(out), stdout=io.StringIO(),
    )  # fmt: skip
    return out


@pytest.fixture
def exported_here(cycle: DropCycle, tmp_path: Path) -> Path:
    """The pack exported in the test itself, for a test that reads the database too."""
    return _export(cycle, tmp_path / "pack.zip")


@pytest.fixture
def exported(evidence_pack: Path, tmp_path: Path) -> Path:
    """The same pack, exported once for the module (``evidence_pack``), copied into the
    test's folder: the tests that only read or tamper with the file."""
    return Path(shutil.copyfile(evidence_pack, tmp_path / "pack.zip"))


@pytest.fixture
def public_key(tmp_path: Path) -> Path:
    out = io.StringIO()
    call_command("evidence", "public-key", stdout=out)
    path = tmp_path / "evidence.pem"
    path.write_text(out.getvalue())
    return path


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rewrite(
    path: Path,
    change: Callable[[dict[str, bytes]], None],
    *,
    key: Ed25519PrivateKey | None = None,
) -> Path:
    """The pack with ``change`` applied to its files; with ``key``, the manifest is brought
    up to date with them (a file added is listed) and signed again (an insider holding a
    key)."""
    files = members(path)
    change(files)
    tampered = path.with_name("tampered.zip")
    _write(tampered, files)
    if key is not None:
        stored = _stored_digests(tampered)
        manifest = json.loads(files[pack.MANIFEST])
        listed = {entry["name"] for entry in manifest["files"]}
        manifest["files"] += [
            {"name": name, "rows": None}
            for name in files
            if name not in listed | {pack.MANIFEST, pack.SIGNATURE}
        ]
        for entry in manifest["files"]:
            content = files[entry["name"]]
            entry["sha256"] = hashlib.sha256(content).hexdigest()
            entry["zip_sha256"] = stored[entry["name"]]
            if entry["name"] == pack.LEDGER:
                entry["rows"] = content.count(b"\n")
        manifest["signing_key"]["public_key"] = pack.public_key_pem(key)
        files[pack.MANIFEST] = json.dumps(manifest, indent=2).encode()
        files[pack.SIGNATURE] = pack.sign_manifest(key, files[pack.MANIFEST])
        _write(tampered, files)
    return tampered


def _write(path: Path, files: dict[str, bytes]) -> None:
    # A new file, not the old one truncated: ext4 flushes a file rewritten that way.
    path.unlink(missing_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            with archive.open(pack.member_info(name), "w", force_zip64=True) as member:
                member.write(content)


def _stored_digests(path: Path) -> dict[str, str]:
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        return {
            info.filename: hashlib.sha256(raw[start : start + info.compress_size]).hexdigest()
            for info in archive.infolist()
            for start in [info.header_offset + 30 + len(info.filename) + 20]
        }


def failure(path: Path, public_key: Path) -> str:
    result = verify_pack(path, public_key_pem=public_key.read_bytes())
    assert not result.ok
    return str(result.failure)


def test_the_pack_holds_the_cycle_and_verifies(exported_here: Path, public_key: Path) -> None:
    exported = exported_here
    files = members(exported)
    assert sorted(files) == [
        "components.json",
        "components/drop_access.csv",
        "components/hashing_vectors.json",
        "components/matching/1.json",
        "components/standardization_vectors.json",
        "drop/1/20261120_4821_Email.csv",
        "drop/1/20261120_4821_Email.csv.answer.json",
        "drop/1/20261120_4821_Phone.csv",
        "drop/1/20261120_4821_Phone.csv.answer.json",
        "ledger.jsonl",
        "manifest.json",
        "manifest.sig",
        "outcomes.csv",
        "summary.html",
    ]
    manifest = json.loads(files[pack.MANIFEST])
    rows = {entry["name"]: entry["rows"] for entry in manifest["files"]}
    assert rows["outcomes.csv"] == 3
    assert rows["drop/1/20261120_4821_Email.csv"] == 6
    assert rows["ledger.jsonl"] == LedgerEvent.objects.filter(broker_id="4821").count() - 1
    assert manifest["ledger_range"]["chain_hash_before"] == "0" * 64
    # The broker is in test mode: DROP's sandbox, said in the signed manifest and the summary,
    # beside each cycle's own mode.
    assert manifest["broker"] == {"broker_id": "4821", "name": "Acme Data", "mode": "test"}
    summary = files[pack.SUMMARY].decode()
    assert "Broker mode at the export: Test (DROP sandbox):" in summary
    assert re.search(r"<td>1</td>.*?<td>test</td>\n</tr>", summary, re.S)
    # Exactly as sent: the bytes uploaded to DROP.
    sent = ReportFile.objects.get(file_name="20261120_4821_Phone.csv")
    assert files["drop/1/20261120_4821_Phone.csv"] == bytes(sent.content)
    assert bytes(sent.content).startswith(b"Id,Status\r\n") and len(_ids(files, "Phone")) == 2
    answer = json.loads(files["drop/1/20261120_4821_Email.csv.answer.json"])
    assert answer["state"] == "accepted" and answer["drop_response"]["status"] == 202
    assert b"Acme Data" in files[pack.SUMMARY] and b"3 deleted" in files[pack.SUMMARY]

    result = verify_pack(exported, public_key_pem=public_key.read_bytes())
    assert result.ok, result.failure
    assert result.key_trusted
    # The export itself is on the record, after the range it exported.
    event = LedgerEvent.objects.get(kind="evidence.exported")
    assert event.data["manifest_sha256"] == hashlib.sha256(files[pack.MANIFEST]).hexdigest()
    assert event.data["ledger_range"]["last_event_id"] < event.id


def _ids(files: dict[str, bytes], list_name: str) -> list[str]:
    content = files[f"drop/1/20261120_4821_{list_name}.csv"].decode()
    return [line.split(",")[0] for line in content.splitlines()[1:]]


def test_one_byte_changed_anywhere_fails(exported: Path, public_key: Path) -> None:
    original = exported.read_bytes()
    tail = len(original) - 1200  # the manifest's end, its signature and the directory
    positions = [p for p in range(len(original)) if p % 17 == 0 or p >= tail]
    tampered = exported.with_name("one-byte.zip")
    tampered.write_bytes(original)
    passed = []
    # The byte is flipped and put back in place: rewriting the whole file each time
    # (truncated, then written) makes ext4 flush it to disk before every verify.
    with tampered.open("r+b", buffering=0) as file:
        for position in positions:
            file.seek(position)
            file.write(bytes([original[position] ^ 0x01]))
            if verify_pack(tampered, public_key_pem=public_key.read_bytes()).ok:
                passed.append(position)
            file.seek(position)
            file.write(original[position : position + 1])
    assert passed == []
    assert len(positions) > 1000


def _with_directory_extra(path: Path, name: str, extra: bytes) -> Path:
    """The pack with ``extra`` added to ``name``'s directory entry's extra fields, the end
    record's directory size brought up to date: no member's bytes change."""
    raw = path.read_bytes()
    end = len(raw) - 22  # the end record, no comment
    record = list(struct.unpack("<4s4H2LH", raw[end:]))
    start, size = record[6], record[5]
    directory, entries, position = raw[start : start + size], b"", 0
    while position < len(directory):
        lengths = struct.unpack("<3H", directory[position + 28 : position + 34])
        entry = directory[position : position + 46 + sum(lengths)]
        if entry[46 : 46 + lengths[0]] == name.encode():
            at = 46 + lengths[0] + lengths[1]
            grown = struct.pack("<H", lengths[1] + len(extra))
            entry = entry[:30] + grown + entry[32:at] + extra + entry[at:]
        entries += entry
        position += 46 + sum(lengths)
    record[5] = len(entries)
    tampered = path.with_name("directory-extra.zip")
    tampered.write_bytes(raw[:start] + entries + struct.pack("<4s4H2LH", *record))
    return tampered


@pytest.mark.parametrize(
    "extra",
    [
        # Info-ZIP's Unicode path: unzip lists summary.html under this name instead.
        struct.pack("<HHB", 0x7075, 5 + 16, 1)
        + struct.pack("<L", zlib.crc32(b"summary.html"))
        + b"ledger-old.jsonl",
        struct.pack("<HH", 0xCAFE, 11) + b"hidden data",  # bytes of no meaning
    ],
    ids=["unicode-path", "unknown-field"],
)
def test_a_field_added_to_a_directory_entry_fails(
    exported: Path, public_key: Path, extra: bytes
) -> None:
    tampered = _with_directory_extra(exported, pack.SUMMARY, extra)
    with zipfile.ZipFile(tampered) as archive:  # still a ZIP every tool opens
        assert archive.getinfo(pack.SUMMARY).extra == extra

    assert failure(tampered, public_key) == (
        "archive member 'summary.html': its directory entry is not as the writer leaves it"
    )


def test_a_changed_byte_names_the_file(exported: Path, public_key: Path) -> None:
    def change(files: dict[str, bytes]) -> None:
        files[pack.OUTCOMES] = files[pack.OUTCOMES].replace(b"exempt", b"exemPt", 1)

    assert failure(rewrite(exported, change), public_key) == (
        "outcomes.csv: its SHA-256 does not match the manifest"
    )


def test_a_removed_ledger_line_fails(exported: Path, public_key: Path) -> None:
    def drop_line(files: dict[str, bytes]) -> None:
        lines = files[pack.LEDGER].splitlines(keepends=True)
        files[pack.LEDGER] = b"".join(lines[:5] + lines[6:])

    assert failure(rewrite(exported, drop_line), public_key) == (
        "ledger.jsonl: its SHA-256 does not match the manifest"
    )
    # Even signed again by someone holding the key, the chain shows the gap.
    resigned = rewrite(exported, drop_line, key=evidence_signing_key())
    assert failure(resigned, public_key).startswith("ledger.jsonl line 6: event ")
    assert failure(resigned, public_key).endswith("'s chain hash does not match")


def test_another_signing_key_fails(exported: Path, public_key: Path) -> None:
    resigned = rewrite(exported, lambda files: None, key=Ed25519PrivateKey.generate())
    assert failure(resigned, public_key).startswith(
        "manifest.json's signature does not verify with the given public key"
    )
    # Without a trusted key the pack's own key is used, and says so.
    result = verify_pack(resigned)
    assert result.ok and not result.key_trusted


def test_an_edited_event_fails_even_when_signed_again(exported: Path, public_key: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        files[pack.LEDGER] = files[pack.LEDGER].replace(b'"exempt"', b'"deleted"', 1)

    resigned = rewrite(exported, edit, key=evidence_signing_key())
    assert "'s content does not match its hash" in failure(resigned, public_key)


def _signed_manifest(
    path: Path,
    change: Callable[[dict[str, Any]], None],
    text: Callable[[str], str] = lambda written: written,
) -> Path:
    """The pack with its manifest changed by ``change`` (then its JSON text by ``text``) and
    signed by a key of its own, enclosed: anyone can make one."""
    key = Ed25519PrivateKey.generate()
    files = members(path)
    manifest = json.loads(files[pack.MANIFEST])
    manifest["signing_key"]["public_key"] = pack.public_key_pem(key)
    change(manifest)
    files[pack.MANIFEST] = text(json.dumps(manifest, indent=2)).encode()
    files[pack.SIGNATURE] = pack.sign_manifest(key, files[pack.MANIFEST])
    crafted = path.with_name("crafted.zip")
    _write(crafted, files)
    return crafted


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m: m.update(broker="4821"), ": broker is not an object"),
        (lambda m: m["broker"].update(broker_id=4821), ": broker has no broker_id string"),
        (lambda m: m.update(ledger_range=[]), ": ledger_range is not an object"),
        (lambda m: m.update(files={}), ": files is not a list"),
        (
            lambda m: m["files"].insert(0, "outcomes.csv"),
            ": files entry 1 is not an object with a name string",
        ),
        (lambda m: m["files"].append(m["files"][0]), " lists outcomes.csv twice"),
        (lambda m: m.update(components="all passed"), ": components is not an object"),
        (lambda m: m.update(signing_key="ed25519"), ": signing_key has no public_key string"),
    ],
    ids=[
        "broker-a-string",
        "broker-id-a-number",
        "ledger-range-a-list",
        "files-an-object",
        "a-file-entry-a-string",
        "a-file-listed-twice",
        "components-a-string",
        "signing-key-a-string",
    ],
)
def test_a_malformed_signed_manifest_is_one_clear_failure(
    exported: Path,
    change: Callable[[dict[str, Any]], None],
    reason: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Verified without --public-key, as an auditor checks a pack from anyone: the enclosed
    # key signs whatever it was given, so the manifest's shape is all that stands.
    assert verify.run(str(exported), public_key=None, as_json=False) == 0
    capsys.readouterr()
    assert verify.run(str(_signed_manifest(exported, change)), public_key=None, as_json=False) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"Evidence pack does not verify: manifest.json{reason}"
    )


def _entry(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [entry for entry in manifest["files"] if entry["name"] == name]
    return entry


def _placed(value: str) -> Callable[[str], str]:
    """The manifest's text with its "@" value written as ``value``: JSON Python does not
    write."""
    return lambda written: written.replace('"@"', value)


_ANSWER = "drop/1/20261120_4821_Email.csv.answer.json"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("NaN", "NaN is not a JSON number"),
        ("-Infinity", "-Infinity is not a JSON number"),
        ("1e999", "1e999 is beyond a float's range"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
    ids=["nan", "infinity", "beyond-a-float", "nested-deep"],
)
def test_a_signed_manifest_of_json_python_does_not_write_is_one_clear_failure(
    exported: Path, value: str, reason: str
) -> None:
    crafted = _signed_manifest(exported, lambda m: m.update(note="@"), _placed(value))
    assert verify_pack(crafted).failure == f"manifest.json is not JSON: {reason}"


@pytest.mark.parametrize(
    ("name", "rows", "counted"),
    [(pack.OUTCOMES, 3.0, 3), (_ANSWER, True, 1)],
    ids=["a-float", "a-bool"],
)
def test_a_row_count_that_is_no_integer_fails(
    exported: Path, name: str, rows: float, counted: int
) -> None:
    crafted = _signed_manifest(exported, lambda m: _entry(m, name).update(rows=rows))
    assert verify_pack(crafted).failure == f"{name}: {counted} rows, the manifest says {rows}"


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("id", "Infinity", "not a ledger line (Infinity is not a JSON number)"),
        ("id", "NaN", "not a ledger line (NaN is not a JSON number)"),
        ("id", "1e999", "not a ledger line (1e999 is beyond a float's range)"),
        ("id", "true", "not a ledger line (its id True is not an integer)"),
        ("id", "{id}.0", "not a ledger line (its id {id}.0 is not an integer)"),
        ("position", "true", "its position True is not an integer"),
        ("position", "1e999", "not a ledger line (1e999 is beyond a float's range)"),
        # Times that are no time in UTC: the hash covers the time in UTC.
        (
            "created_at",
            '"9999-12-31T23:59:59.000000-05:00"',
            "not a ledger event (date value out of range)",
        ),
        (
            "created_at",
            '"0001-01-01T00:00:00.000000+05:00"',
            "not a ledger event (date value out of range)",
        ),
    ],
)
def test_a_ledger_line_of_malformed_values_is_one_clear_failure(
    exported: Path, public_key: Path, field: str, value: str, reason: str
) -> None:
    """Signed again by someone holding the key: the values the checks read are held to
    their types, not converted or left to raise."""
    first = json.loads(members(exported)[pack.LEDGER].splitlines()[0])
    assert "kind" in first  # the broker's, in full

    def edit(files: dict[str, bytes]) -> None:
        lines = files[pack.LEDGER].decode().splitlines(keepends=True)
        event = json.loads(lines[0])
        event[field] = "@"
        lines[0] = json.dumps(event).replace('"@"', value.format(id=first["id"])) + "\n"
        files[pack.LEDGER] = "".join(lines).encode()

    assert failure(rewrite(exported, edit, key=evidence_signing_key()), public_key) == (
        f"ledger.jsonl line 1: {reason.format(id=first['id'])}"
    )


def test_a_ledger_time_without_its_utc_offset_is_refused(exported: Path, public_key: Path) -> None:
    """Written as this machine's local time, it hashes as the event did here: read in the
    auditor's local time, the same line would be another moment on another machine."""
    first = json.loads(members(exported)[pack.LEDGER].splitlines()[0])
    local = dt.datetime.fromisoformat(first["created_at"]).astimezone().replace(tzinfo=None)
    naive = local.isoformat(timespec="microseconds")

    def edit(files: dict[str, bytes]) -> None:
        lines = files[pack.LEDGER].decode().splitlines(keepends=True)
        lines[0] = json.dumps({**json.loads(lines[0]), "created_at": naive}) + "\n"
        files[pack.LEDGER] = "".join(lines).encode()

    assert failure(rewrite(exported, edit, key=evidence_signing_key()), public_key) == (
        f"ledger.jsonl line 1: not a ledger event (created_at {naive!r} has no UTC offset)"
    )


@pytest.mark.parametrize(
    ("position", "reason"),
    [
        ("Infinity", "Infinity is not a JSON number"),
        ("1e999", "1e999 is beyond a float's range"),
        ("true", "the position True is not an integer"),
        ("1.0", "the position 1.0 is not an integer"),
    ],
)
def test_an_anchor_list_of_malformed_positions_is_one_clear_failure(
    exported: Path, public_key: Path, position: str, reason: str
) -> None:
    def add(files: dict[str, bytes]) -> None:
        files["anchors/1.tsr"] = b"not a token"
        files["anchors.json"] = (
            json.dumps(
                {
                    "format": "dropportal-anchors/1",
                    "anchors": [
                        {"position": "@", "chain_hash": "0" * 64, "token": "anchors/1.tsr"}
                    ],
                }
            )
            .replace('"@"', position)
            .encode()
        )

    assert failure(rewrite(exported, add, key=evidence_signing_key()), public_key) == (
        f"anchors.json: {reason}"
    )


@pytest.mark.parametrize("not_found", ["many", True], ids=["a-string", "a-bool"])
def test_a_ledger_event_of_an_unexpected_shape_is_one_clear_failure(
    cycle: DropCycle, tmp_path: Path, public_key: Path, not_found: str | bool
) -> None:
    # Hashed and chained like any other: only its data is not what the checks read.
    ledger_event_append(
        kind=LedgerKind.DROP_CYCLE_IMPORTED,
        broker_id="4821",
        subject="1",
        actor="cli:mallory",
        data={"drop_session_id": "1", "not_found": not_found},
    )
    out = tmp_path / "odd.zip"
    call_command(
        "evidence", "export", "--broker", "4821", "--cycle", "1", "--out", str(out),
        stdout=io.StringIO(),
    )  # fmt: skip
    assert failure(out, public_key).endswith("'s not_found is not a number")


def test_an_outcome_without_its_event_fails(exported: Path, public_key: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        files[pack.OUTCOMES] = files[pack.OUTCOMES].replace(b",exempt,", b",not_found,", 1)

    message = failure(rewrite(exported, edit, key=evidence_signing_key()), public_key)
    assert message.startswith("outcomes.csv row ")
    assert message.endswith(
        "its outcome 'not_found' has no deletion_request.outcome_recorded event"
    )


def test_a_drop_status_without_its_event_fails(exported: Path, public_key: Path) -> None:
    name = "drop/1/20261120_4821_Phone.csv"

    def edit(files: dict[str, bytes]) -> None:
        files[name] = files[name].replace(b",5\r\n", b",3\r\n", 1)

    message = failure(rewrite(exported, edit, key=evidence_signing_key()), public_key)
    assert message.startswith(f"{name} line 2: status 3 of work item ")
    assert message.endswith(" has no work_item event")


@pytest.mark.parametrize("how", ["by-staff", "in-the-database"])
def test_an_amended_status_5_needs_its_event(
    broker: Broker, tmp_path: Path, public_key: Path, how: str
) -> None:
    """A status 5 without an event is a work item the import did not match, which DROP
    first gets in an upload: in an amendment it is a status changed past the ledger."""
    with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
        cycle = evidence_world(broker, drop, tmp_path)
        item = (
            WorkItem.objects.filter(cycle=cycle).exclude(reported_status_code=5).order_by("pk")[0]
        )
        if how == "by-staff":
            work_item_status_set(work_item=item, status_code=5, reason="no such person", actor="t")
        else:
            WorkItem.objects.filter(pk=item.pk).update(
                status_code=5, state=WorkItemState.REPORTABLE, needs_amendment=True
            )
        client = DropClient(drop.url, DROP_KEY, allow_private=True)
        (amendment,) = report_run(broker=broker, upload=True, client=client, actor="t").accepted
    assert amendment.kind == "amend"
    assert bytes(amendment.content) == f"Id,Status\r\n{item.work_item_id},5\r\n".encode()

    exported = _export(cycle, tmp_path / "pack.zip")
    result = verify_pack(exported, public_key_pem=public_key.read_bytes())

    if how == "by-staff":
        assert result.ok, result.failure

        # Its answer said to be an upload's, signed again: the ledger says what it is.
        def relabelled(files: dict[str, bytes]) -> None:
            name = f"drop/1/{amendment.file_name}{pack.ANSWER_SUFFIX}"
            files[name] = files[name].replace(b'"kind":"amend"', b'"kind":"upload"')

        assert failure(rewrite(exported, relabelled, key=evidence_signing_key()), public_key) == (
            f"drop/1/{amendment.file_name}: no report_file.written event with its kind, digest "
            "and rows"
        )
    else:
        assert result.failure == (
            f"drop/1/{amendment.file_name} line 2: status 5 of work item {item.work_item_id} "
            "has no work_item event"
        )


def test_a_rejected_upload_of_more_statuses_5_than_the_import_found_fails(
    broker: Broker, tmp_path: Path, public_key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DROP holds nothing of a rejected file, but what was sent is held to the ledger too:
    one file cannot hold more unmatched work items than the import found."""
    with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
        cycle = evidence_world(broker, drop, tmp_path)
        assert cycle.not_found == 5
        # Past the ledger: every work item of the Email list sent again with a 5.
        WorkItem.objects.filter(cycle=cycle, file_name__endswith="Email.csv").update(
            status_code=5, state=WorkItemState.REPORTABLE, needs_amendment=False
        )
        monkeypatch.setattr(drop, "_check_file", lambda *args, **kwargs: "Not this time.")
        client = DropClient(drop.url, DROP_KEY, allow_private=True)
        (rejected,) = report_run(broker=broker, upload=True, client=client, actor="t").rejected
    assert (rejected.kind, rejected.rows) == ("upload", 6)

    exported = _export(cycle, tmp_path / "pack.zip")
    result = verify_pack(exported, public_key_pem=public_key.read_bytes())

    assert result.failure == (
        f"drop/1/{rejected.file_name}: 6 statuses 5 without a work_item event, the import "
        "found 5 work items without a match"
    )


def test_an_answer_of_drop_that_carries_a_url_verifies(
    broker: Broker, tmp_path: Path, public_key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger keeps DROP's answer with its URLs cut to their scheme, host and path; the
    pack's answer file keeps it as DROP sent it."""
    accept = DropSimulator._accept_files

    def with_a_link(drop: DropSimulator, request: Any) -> Any:
        scripted = accept(drop, request)
        body = json.loads(scripted.body)
        body["message"] += " Status: https://drop.example/uploads?ticket=T-1#top"
        scripted.body = json.dumps(body).encode()
        return scripted

    monkeypatch.setattr(DropSimulator, "_accept_files", with_a_link)
    with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
        cycle = evidence_world(broker, drop, tmp_path)
    sent = ReportFile.objects.get(file_name="20261120_4821_Email.csv")
    assert sent.drop_response["message"].endswith("https://drop.example/uploads?ticket=T-1#top")
    event = LedgerEvent.objects.get(kind="report_file.accepted", subject=sent.file_name)
    assert event.data["drop_response"]["message"].endswith("https://drop.example/uploads")
    out = _export(cycle, tmp_path / "pack.zip")

    result = verify_pack(out, public_key_pem=public_key.read_bytes())
    assert result.ok, result.failure

    # What the ledger keeps of the URL is still held to it.
    def moved(files: dict[str, bytes]) -> None:
        name = f"drop/1/{sent.file_name}{pack.ANSWER_SUFFIX}"
        files[name] = files[name].replace(b"drop.example/uploads", b"drop.example/other")

    assert failure(rewrite(out, moved, key=evidence_signing_key()), public_key) == (
        f"drop/1/{sent.file_name}: DROP's answer (accepted) has no matching ledger event"
    )


def test_an_answer_nested_too_deeply_to_check_is_one_clear_failure(
    exported: Path, public_key: Path
) -> None:
    """Deep enough to parse, too deep for the checks that recurse through it after."""
    name = f"drop/1/20261120_4821_Email.csv{pack.ANSWER_SUFFIX}"

    def nested(files: dict[str, bytes]) -> None:
        answer = json.loads(files[name])
        answer["drop_response"] = "@"
        depth = sys.getrecursionlimit() * 2 // 3
        files[name] = json.dumps(answer).replace('"@"', "[" * depth + "]" * depth).encode()

    assert failure(rewrite(exported, nested, key=evidence_signing_key()), public_key) == (
        "a value in the pack is nested too deeply to check"
    )


_BLOCKER = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'django', 'psycopg', 'psycopg2', 'rest_framework',
                                  'procrastinate', 'sqlite3', '_sqlite3'}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Blocked())
import runpy
sys.argv = ARGV
runpy.run_path(PATH, run_name='__main__') if PATH else runpy.run_module(
    'integrations.evidence.verify', run_name='__main__')
"""


@pytest.mark.parametrize("via", ["module", "manage.py"])
def test_verify_runs_without_django_or_a_database(
    exported: Path, public_key: Path, via: str
) -> None:
    args = [str(exported), "--public-key", str(public_key), "--json"]
    argv = ["manage.py", "evidence", "verify", *args] if via == "manage.py" else ["verify", *args]
    script = _BLOCKER.replace("ARGV", repr(argv)).replace(
        "PATH", repr(str(ROOT / "manage.py")) if via == "manage.py" else "''"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # no DATABASE_URL, no settings
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["key_trusted"]
    assert report["broker"]["broker_id"] == "4821"

    damaged = rewrite(exported, lambda files: files.update({pack.LEDGER: b""}))
    argv[argv.index(str(exported))] = str(damaged)
    script = _BLOCKER.replace("ARGV", repr(argv)).replace(
        "PATH", repr(str(ROOT / "manage.py")) if via == "manage.py" else "''"
    )
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr == (
        "Evidence pack does not verify: ledger.jsonl: its SHA-256 does not match the manifest\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: pack"),
        (["pack.zip", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_argument_to_verify_is_one_line_on_stderr(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # What manage.py hands `evidence verify ...` to, before Django starts.
    with pytest.raises(SystemExit) as exited:
        verify.main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == f"evidence verify: error: {message}\n"
    assert captured.out == ""


def test_without_a_public_key_verify_says_the_signer_was_not_checked(
    exported: Path, public_key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A pack re-signed by anyone, with their key enclosed, passes the integrity checks: the
    # auditor must be told that is all that was checked.
    resigned = rewrite(exported, lambda files: None, key=Ed25519PrivateKey.generate())
    call_command("evidence", "verify", str(resigned), "--json")
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["ok"] and report["signer_checked"] is False
    assert captured.err.startswith("note: integrity checked against the public key the pack")
    assert "not who signed it" in captured.err

    call_command("evidence", "verify", str(exported), "--public-key", str(public_key), "--json")
    captured = capsys.readouterr()
    assert json.loads(captured.out)["signer_checked"] is True
    assert "integrity checked against" not in captured.err


def test_the_command_verifies_and_exits_1_on_a_failure(exported: Path, public_key: Path) -> None:
    out = io.StringIO()
    call_command("evidence", "verify", str(exported), "--public-key", str(public_key), stdout=out)
    damaged = rewrite(exported, lambda files: files.update({pack.OUTCOMES: b"x"}))
    with pytest.raises(SystemExit) as exit_info:
        call_command("evidence", "verify", str(damaged), stdout=io.StringIO())
    assert exit_info.value.code == 1


def test_a_period_export_covers_the_same_records(cycle: DropCycle, tmp_path: Path) -> None:
    out = tmp_path / "year.zip"
    call_command(
        "evidence", "export", "--broker", "4821", "--since", "2026-01-01",
        "--until", "2026-12-31", "--out", str(out), "--json", stdout=(stdout := io.StringIO()),
    )  # fmt: skip
    manifest = json.loads(stdout.getvalue())
    assert manifest["period"] == {  # DROP's year: from midnight in California, in UTC
        "since": "2026-01-01T08:00:00+00:00",
        "until": "2027-01-01T08:00:00+00:00",
    }
    assert verify_pack(out).ok


def test_period_dates_are_days_of_drops_calendar(cycle: DropCycle, tmp_path: Path) -> None:
    # 03:00 UTC on July 2 is still July 1 in California, the day DROP counts it in.
    late = dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC)
    request = DeletionRequest.objects.filter(broker__broker_id="4821").order_by("pk").first()
    assert request is not None
    DeletionRequest.objects.filter(pk=request.pk).update(matched_at=late)

    def outcomes(since: str, until: str) -> str:
        out = tmp_path / f"{since}_{until}.zip"
        call_command(
            "evidence", "export", "--broker", "4821", "--since", since, "--until", until,
            "--out", str(out), stdout=io.StringIO(),
        )  # fmt: skip
        return members(out)[pack.OUTCOMES].decode()

    assert str(request.request_uuid) in outcomes("2026-07-01", "2026-07-01")
    assert str(request.request_uuid) not in outcomes("2026-07-02", "2026-07-02")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cycle", "99"], "broker 4821 has no cycle '99'"),
        (["--since", "2026-01-01"], "give --cycle, or both --since and --until"),
        (["--cycle", "1", "--since", "2026-01-01"], "give --cycle or --since and --until"),
        (["--since", "2026-02-01", "--until", "2026-01-01"], "--until must be after --since"),
    ],
)
def test_bad_requests_write_nothing(
    cycle: DropCycle, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "pack.zip"
    with pytest.raises(CommandError, match=message):
        call_command("evidence", "export", "--broker", "4821", *args, "--out", str(out))
    assert list(tmp_path.glob("pack.zip*")) == []
    assert not LedgerEvent.objects.filter(kind="evidence.exported").exists()


def test_without_a_configured_key_one_is_generated_on_first_use_and_kept(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DROPPORTAL_EVIDENCE_KEY = ""
    monkeypatch.setattr(local_state, "VAR_DIR", tmp_path)
    assert not (tmp_path / "evidence_key.pem").exists()  # nothing made before it is needed
    first = evidence_signing_key()
    assert (tmp_path / "evidence_key.pem").stat().st_mode & 0o777 == 0o600
    assert pack.public_key_pem(evidence_signing_key()) == pack.public_key_pem(first)


def test_a_discarded_amendment_is_in_the_pack_with_its_reason(
    broker: Broker, tmp_path: Path, public_key: Path
) -> None:
    with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
        cycle = evidence_world(broker, drop, tmp_path)
        item = WorkItem.objects.filter(cycle=cycle, reported_status_code=5).order_by("pk")[0]
        work_item_status_set(work_item=item, status_code=3, reason="found by hand", actor="t")
        drop.closed_downloads.add("20261120")
        client = DropClient(drop.url, DROP_KEY, allow_private=True)
        (refused,) = report_run(broker=broker, upload=True, client=client, actor="t").refused
    report_file_discard(report_file=refused, reason="DROP closed the cycle", actor="cli:al")
    out = _export(cycle, tmp_path / "pack.zip")

    files = members(out)
    name = f"drop/1/{refused.file_name}"
    assert files[name] == f"Id,Status\r\n{item.work_item_id},3\r\n".encode()
    answer = json.loads(files[name + pack.ANSWER_SUFFIX])
    assert (answer["state"], answer["discard_reason"], answer["discarded_by"]) == (
        "discarded",
        "DROP closed the cycle",
        "cli:al",
    )
    assert answer["drop_response"]["status"] == 409
    assert b"5 not found" in files[pack.SUMMARY]  # what DROP holds, not the amendment's 3
    result = verify_pack(out, public_key_pem=public_key.read_bytes())
    assert result.ok, result.failure


def test_the_summarys_cycle_times_read_in_the_calendar_of_their_due_dates(
    cycle: DropCycle, tmp_path: Path
) -> None:
    """A due date is a California day: a time beside it in unlabelled UTC reads a day late
    in the evening (a download at 22:30 in California is 06:30 the next day in UTC)."""
    la = ZoneInfo("America/Los_Angeles")
    evening = dt.datetime(2026, 11, 19, 22, 30, tzinfo=la)
    DropCycle.objects.filter(pk=cycle.pk).update(downloaded_at=evening)
    out = _export(cycle, tmp_path / "pack.zip")
    summary = members(out)[pack.SUMMARY].decode()
    row = re.search(r"<tr>\s*<td>1</td>.*?</tr>", summary, re.S)
    assert row is not None
    cells = [
        re.sub(r"<[^>]+>", " ", cell).split()
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
    ]
    assert cells[1] == ["2026-11-19", "22:30", "PST", "2026-11-20", "06:30", "UTC"]
    reported = LedgerEvent.objects.get(kind="drop_cycle.reported", subject="1").created_at
    there, utc = reported.astimezone(la), reported.astimezone(dt.UTC)
    assert cells[3] == [
        *f"{there:%Y-%m-%d %H:%M} {there.tzname()}".split(),
        *f"{utc:%Y-%m-%d %H:%M} UTC".split(),
    ]
    assert "America/Los_Angeles" in summary  # the calendar named once, above the table


def test_the_summary_says_utc_whatever_zone_the_caller_reads_in(
    cycle: DropCycle, tmp_path: Path
) -> None:
    # The admin renders its pages in DROP's zone; an export stays UTC.
    with timezone.override(ZoneInfo("America/Los_Angeles")):
        out = _export(cycle, tmp_path / "pack.zip")
    summary = members(out)[pack.SUMMARY].decode()
    exported = re.search(r"Exported (\S+)\.", summary)
    assert exported is not None and exported.group(1).endswith("+00:00")
    downloaded = timezone.localtime(cycle.downloaded_at, dt.UTC).strftime("%Y-%m-%d %H:%M")
    assert downloaded in summary
