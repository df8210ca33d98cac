"""An evidence pack carries the RFC 3161 tokens of its ledger range, and ``evidence verify
--tsa-cert FILE`` checks them offline: each token's imprint is the chain hash the verifier
recomputes at its position, and its signature chains to the authority's certificate."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from devtools.drop_simulator import DropSimulator
from devtools.tsa_simulator import TsaSimulator
from integrations.evidence import pack, timestamps
from integrations.evidence.timestamps import load_certificates
from integrations.evidence.verify import verify_pack
from integrations.ledger_hash import chain_hash, event_hash
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropCycle, LedgerAnchor, LedgerChainLink
from integrations.services.evidence.evidence import evidence_signing_key
from integrations.services.ledger import ledger_event_append, ledger_seal
from integrations.services.ledger_anchors import ledger_anchor
from tests.builders import anchor_moved_to_head
from tests.commands.test_evidence import failure, rewrite
from tests.evidence_world import DROP_KEY, evidence_world

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path) -> Iterator[DropCycle]:
    with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
        yield evidence_world(broker, drop, tmp_path)


@pytest.fixture
def public_key(tmp_path: Path) -> Path:
    out = io.StringIO()
    call_command("evidence", "public-key", stdout=out)
    path = tmp_path / "evidence.pem"
    path.write_text(out.getvalue())
    return path


def broker_event() -> None:
    """One more event of the broker, so the range runs past the anchored head."""
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.BROKER_UPDATED, broker_id="4821", subject="4821", data={"n": 1}
        )


def export(cycle: DropCycle, tmp_path: Path) -> Path:
    out = tmp_path / "pack.zip"
    call_command(
        "evidence", "export", "--broker", "4821", "--cycle", cycle.drop_session_id,
        "--out", str(out), stdout=io.StringIO(),
    )  # fmt: skip
    return out


def authority(tsa: TsaSimulator) -> list[x509.Certificate]:
    return load_certificates(tsa.ca_pem)


def test_the_pack_carries_its_ranges_tokens_and_they_verify(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    anchor = ledger_anchor()
    broker_event()
    exported = export(cycle, tmp_path)
    with zipfile.ZipFile(exported) as archive:
        listed = json.loads(archive.read(timestamps.PACK_LIST))
        assert archive.read(f"anchors/{anchor.position}.tsr") == bytes(anchor.token)
        summary = archive.read("summary.html").decode()
    assert "1 RFC 3161 time-stamp token of an outside\nauthority covers positions" in summary
    assert listed == {
        "format": timestamps.PACK_FORMAT,
        "anchors": [
            {
                "position": anchor.position,
                "event_id": anchor.event_id,
                "chain_hash": anchor.chain_hash,
                "token": f"anchors/{anchor.position}.tsr",
                "token_sha256": anchor.token_sha256,
                "gen_time": anchor.gen_time.isoformat(),
                "tsa_url": tsa.url,
            }
        ],
    }
    result = verify_pack(
        exported, public_key_pem=public_key.read_bytes(), tsa_certificates=authority(tsa)
    )
    assert result.ok, result.failure
    (said,) = [line for line in result.checks if line.startswith("timestamps:")]
    # The events chained after it (the anchoring's own, the broker's) are said unanchored.
    p = anchor.position
    assert said.startswith(
        f"timestamps: 1 tokens cover the chain hashes at positions {p}; the last, position "
        f"{p}, at {anchor.gen_time.isoformat()}, leaves "
    )
    after = [
        json.loads(line)
        for line in zipfile.ZipFile(exported).read("ledger.jsonl").splitlines()
        if json.loads(line).get("chain_hash") and json.loads(line)["position"] > p
    ]
    assert f"leaves {len(after)} chained events (positions {p + 1} to " in said
    assert said.endswith(
        " anchored by no token in this pack; each signature chains to the given certificate"
    )
    unchecked = verify_pack(exported, public_key_pem=public_key.read_bytes())
    assert unchecked.ok, unchecked.failure
    assert any(
        "present but not checked against an authority (pass --tsa-cert FILE)" in line
        for line in unchecked.checks
    )


def test_a_token_at_the_ranges_end_leaves_nothing_unanchored(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    broker_event()
    anchor = ledger_anchor()  # the broker's event is the head it covers

    result = verify_pack(export(cycle, tmp_path), public_key_pem=public_key.read_bytes())

    assert result.ok, result.failure
    (said,) = [line for line in result.checks if line.startswith("timestamps:")]
    assert f"; the last, position {anchor.position}, at {anchor.gen_time.isoformat()}; " in said
    assert "anchored by no token" not in said


def test_a_pack_without_tokens_says_its_chain_is_anchored_nowhere(
    evidence_pack: Path, public_key: Path
) -> None:
    exported = evidence_pack  # read only
    result = verify_pack(exported, public_key_pem=public_key.read_bytes())
    assert result.ok, result.failure
    assert any("no time-stamp token in the ledger range" in line for line in result.checks)
    with zipfile.ZipFile(exported) as archive:
        summary = archive.read("summary.html").decode()
    assert "No time-stamp token of an outside authority covers this range" in summary


def _rewritten_at(position: int) -> Callable[[dict[str, bytes]], None]:
    """An insider's rewrite: the event at ``position`` changed, its hash and every chain link
    from it recomputed, the manifest's chain end brought up to date."""

    def change(files: dict[str, bytes]) -> None:
        manifest = json.loads(files[pack.MANIFEST])
        previous = manifest["ledger_range"]["chain_hash_before"]
        lines = []
        for line in files[pack.LEDGER].decode().splitlines():
            event = json.loads(line)
            if event.get("chain_hash") is not None:
                if event["position"] == position:
                    assert "kind" in event  # the broker's own, given in full
                    event["data"]["rewritten"] = True
                    created_at = dt.datetime.fromisoformat(event["created_at"])
                    fields = ("broker_id", "kind", "subject", "actor", "data")
                    event["event_hash"] = event_hash(
                        created_at=created_at, **{k: event[k] for k in fields}
                    )
                previous = chain_hash(previous, event["id"], event["event_hash"])
                event["chain_hash"] = previous
            lines.append(json.dumps(event) + "\n")
        files[pack.LEDGER] = "".join(lines).encode()
        manifest["ledger_range"]["chain_hash_after"] = previous
        files[pack.MANIFEST] = json.dumps(manifest).encode()

    return change


def _without_tokens(files: dict[str, bytes]) -> None:
    for name in [name for name in files if name.startswith("anchors")]:
        del files[name]
    manifest = json.loads(files[pack.MANIFEST])
    manifest["files"] = [e for e in manifest["files"] if not e["name"].startswith("anchors")]
    files[pack.MANIFEST] = json.dumps(manifest).encode()


def test_a_rewritten_chain_without_its_tokens_fails_with_the_given_certificate(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    """A key holder who rewrites an anchored event and the chain after it cannot keep the
    token (it covers the old head), and leaving the tokens out must not pass either when
    the auditor asks for the anchoring to be checked."""
    anchor = ledger_anchor()
    broker_event()
    exported = export(cycle, tmp_path)
    key, authorities = evidence_signing_key(), authority(tsa)
    rewrite_anchored = _rewritten_at(anchor.position)

    kept = rewrite(exported, rewrite_anchored, key=key)
    assert verify_pack(kept, public_key_pem=public_key.read_bytes()).failure == (
        f"anchors.json: position {anchor.position}'s chain hash is not the chain's "
        f"({_chain_hash_at(kept, anchor.position)})"
    )

    def rewritten_without_tokens(files: dict[str, bytes]) -> None:
        rewrite_anchored(files)
        _without_tokens(files)

    dropped = rewrite(exported, rewritten_without_tokens, key=key)
    result = verify_pack(
        dropped, public_key_pem=public_key.read_bytes(), tsa_certificates=authorities
    )
    assert not result.ok
    chained = sum(
        1
        for line in members_of(dropped)[pack.LEDGER].splitlines()
        if json.loads(line).get("chain_hash") is not None
    )
    assert result.failure == (
        "timestamps: no time-stamp token in the ledger range, which holds "
        f"{chained} chained events: --tsa-cert needs the tokens that anchor them"
    )
    # Without an authority to check against, the pack is whole and says it is unanchored.
    unchecked = verify_pack(dropped, public_key_pem=public_key.read_bytes())
    assert unchecked.ok, unchecked.failure
    assert (
        f"timestamps: no time-stamp token in the ledger range (its chain, {chained} chained "
        "events, is anchored nowhere outside the service in this pack)"
    ) in unchecked.checks


def _written_ahead(monkeypatch: pytest.MonkeyPatch, ahead: dt.timedelta) -> None:
    """One more event of the broker, written ``ahead`` of now. The loopback authority stamps
    with the real clock, so the events are moved rather than the tokens."""
    real_now = timezone.now
    with monkeypatch.context() as moved:
        moved.setattr(timezone, "now", lambda: real_now() + ahead)
        broker_event()


def _without_tokens_from(position: int) -> Callable[[dict[str, bytes]], None]:
    """The tokens at ``position`` and after left out, the others kept."""

    def change(files: dict[str, bytes]) -> None:
        listed = json.loads(files[timestamps.PACK_LIST])
        dropped = [e for e in listed["anchors"] if e["position"] >= position]
        listed["anchors"] = [e for e in listed["anchors"] if e["position"] < position]
        files[timestamps.PACK_LIST] = json.dumps(listed).encode()
        names = {entry["token"] for entry in dropped}
        for name in names:
            del files[name]
        manifest = json.loads(files[pack.MANIFEST])
        manifest["files"] = [e for e in manifest["files"] if e["name"] not in names]
        files[pack.MANIFEST] = json.dumps(manifest).encode()

    return change


def test_a_pack_whose_newest_tokens_were_left_out_fails_with_the_given_certificate(
    cycle: DropCycle,
    tsa: TsaSimulator,
    tmp_path: Path,
    public_key: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key holder who rewrites the events after one token leaves the later tokens out
    (they cover the old heads): the events' own times then show the tokens stop days
    before the range ends, though the service asks for one every day."""
    first = ledger_anchor()
    _written_ahead(monkeypatch, dt.timedelta(days=3))
    last = ledger_anchor()
    broker_event()
    exported = export(cycle, tmp_path)
    key, authorities = evidence_signing_key(), authority(tsa)
    whole = verify_pack(
        exported, public_key_pem=public_key.read_bytes(), tsa_certificates=authorities
    )
    assert whole.ok, whole.failure

    cut = rewrite(exported, _without_tokens_from(last.position), key=key)

    result = verify_pack(cut, public_key_pem=public_key.read_bytes(), tsa_certificates=authorities)
    assert not result.ok
    # The latest the pack shows among the events after the first token: the one written ahead.
    ahead = max(
        (
            json.loads(line)
            for line in members_of(cut)[pack.LEDGER].splitlines()
            if "kind" in json.loads(line)
            and json.loads(line).get("chain_hash") is not None
            and json.loads(line)["position"] > first.position
        ),
        key=lambda event: event["created_at"],
    )
    written = dt.datetime.fromisoformat(ahead["created_at"])
    assert written - first.gen_time > dt.timedelta(days=2)
    hours = (written - first.gen_time).total_seconds() / 3600
    assert result.failure == (
        f"timestamps: the last token (position {first.position}) is of "
        f"{first.gen_time.isoformat()}, the event at position {ahead['position']} was written "
        f"at {written.isoformat()}, {hours:.1f} hours later: the service asks the authority "
        "for a token every day, so --tsa-cert accepts at most 48.0 hours from the last token "
        "to the last event (one day's anchor missed); the later tokens are missing from the "
        "pack, or the service stopped anchoring"
    )
    # Without an authority to check against, the pack is whole and says what is unanchored.
    unchecked = verify_pack(cut, public_key_pem=public_key.read_bytes())
    assert unchecked.ok, unchecked.failure
    (said,) = [line for line in unchecked.checks if line.startswith("timestamps:")]
    assert f"; the last, position {first.position}, at {first.gen_time.isoformat()}, leaves " in (
        said
    )


def test_a_pack_exported_right_after_the_days_anchor_passes_with_the_given_certificate(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    broker_event()
    anchor = ledger_anchor()
    broker_event()

    exported = export(cycle, tmp_path)

    result = verify_pack(
        exported, public_key_pem=public_key.read_bytes(), tsa_certificates=authority(tsa)
    )
    assert result.ok, result.failure
    (said,) = [line for line in result.checks if line.startswith("timestamps:")]
    assert f"; the last, position {anchor.position}, at {anchor.gen_time.isoformat()}, " in said
    assert said.endswith("; each signature chains to the given certificate")


@pytest.mark.parametrize(("hours", "passes"), [(47, True), (49, False)])
def test_events_after_the_last_token_pass_within_the_margin(
    cycle: DropCycle,
    tsa: TsaSimulator,
    tmp_path: Path,
    public_key: Path,
    monkeypatch: pytest.MonkeyPatch,
    hours: int,
    passes: bool,
) -> None:
    """One day's anchor missed (the authority down, the job not run) is tolerated; two are
    not, whether the tokens were left out or never asked for."""
    anchor = ledger_anchor()
    _written_ahead(monkeypatch, dt.timedelta(hours=hours))
    exported = export(cycle, tmp_path)
    authorities = authority(tsa)

    result = verify_pack(
        exported, public_key_pem=public_key.read_bytes(), tsa_certificates=authorities
    )

    if passes:
        assert result.ok, result.failure
        (said,) = [line for line in result.checks if line.startswith("timestamps:")]
        assert f"; the last, position {anchor.position}, at " in said
        assert "anchored by no token in this pack" in said
    else:
        assert result.failure is not None
        assert result.failure.startswith(
            f"timestamps: the last token (position {anchor.position}) is of "
            f"{anchor.gen_time.isoformat()}, the event at position "
        )
    assert verify_pack(exported, public_key_pem=public_key.read_bytes()).ok


def members_of(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _chain_hash_at(path: Path, position: int) -> str:
    for line in members_of(path)[pack.LEDGER].splitlines():
        event = json.loads(line)
        if event.get("position") == position and event.get("chain_hash") is not None:
            return str(event["chain_hash"])
    raise AssertionError(position)


def test_a_token_under_another_authority_fails_with_the_given_certificate(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    anchor = ledger_anchor()
    broker_event()
    exported = export(cycle, tmp_path)
    with TsaSimulator(name="another TSA") as other:
        wrong = authority(other)
    result = verify_pack(exported, public_key_pem=public_key.read_bytes(), tsa_certificates=wrong)
    assert not result.ok
    assert str(result.failure).startswith(
        f"anchors/{anchor.position}.tsr (position {anchor.position}): its signature does not "
        "chain to the given certificate"
    )


def test_a_token_of_another_chain_head_fails_and_is_named(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    honest = ledger_anchor()
    broker_event()
    forged = anchor_moved_to_head(honest)
    exported = export(cycle, tmp_path)
    result = verify_pack(
        exported, public_key_pem=public_key.read_bytes(), tsa_certificates=authority(tsa)
    )
    assert result.failure == (
        f"anchors/{forged.position}.tsr (position {forged.position}): it covers another "
        f"chain head, not {forged.chain_hash}"
    )


def _naive(anchor: LedgerAnchor) -> str:
    return anchor.gen_time.replace(tzinfo=None).isoformat()


@pytest.mark.parametrize(
    "stated",
    [
        lambda a: {"event_id": a.event_id - 1},
        lambda a: {"token_sha256": "0" * 64},
        lambda a: {"gen_time": (a.gen_time - dt.timedelta(hours=1)).isoformat()},
        lambda a: {"gen_time": _naive(a)},
        lambda a: {"token": f"anchors/{a.position + 1}.tsr"},
    ],
    ids=["event-id", "token-sha256", "gen-time", "gen-time-naive", "token-name"],
)
def test_what_the_list_says_of_a_token_is_held_to_the_ledger_and_the_token(
    cycle: DropCycle,
    tsa: TsaSimulator,
    tmp_path: Path,
    public_key: Path,
    stated: Callable[[LedgerAnchor], dict[str, Any]],
) -> None:
    """Signed again by someone holding the key: each field of ``anchors.json`` is compared
    with the ledger line at its position, the token's own time and the token file's digest."""
    anchor = ledger_anchor()
    broker_event()
    change = stated(anchor)
    name = f"anchors/{anchor.position}.tsr"

    def edit(files: dict[str, bytes]) -> None:
        listed = json.loads(files[timestamps.PACK_LIST])
        listed["anchors"][0].update(change)
        files[timestamps.PACK_LIST] = json.dumps(listed).encode()
        if "token" in change:  # the file renamed, in the manifest too
            files[change["token"]] = files.pop(name)
            manifest = json.loads(files["manifest.json"])
            for entry in manifest["files"]:
                entry["name"] = change["token"] if entry["name"] == name else entry["name"]
            files["manifest.json"] = json.dumps(manifest).encode()

    written = anchor.gen_time.isoformat()
    reason = {
        "event_id": f"event_id {anchor.event_id - 1} is not the ledger's ({anchor.event_id})",
        "token_sha256": f"token_sha256 is not the token's ({anchor.token_sha256})",
        "gen_time": (
            f"gen_time {_naive(anchor)!r} has no UTC offset"
            if change.get("gen_time") == _naive(anchor)
            else f"gen_time {change.get('gen_time')} is not the token's ({written})"
        ),
        "token": "its token is not named for its position",
    }[next(iter(change))]
    named = change.get("token", name)
    tampered = rewrite(export(cycle, tmp_path), edit, key=evidence_signing_key())
    assert failure(tampered, public_key) == (
        f"anchors.json: the anchor of position {anchor.position} ({named}): {reason}"
    )


def test_a_token_listed_for_two_anchors_fails(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    anchor = ledger_anchor()
    broker_event()

    def edit(files: dict[str, bytes]) -> None:
        listed = json.loads(files[timestamps.PACK_LIST])
        listed["anchors"] *= 2
        files[timestamps.PACK_LIST] = json.dumps(listed).encode()

    tampered = rewrite(export(cycle, tmp_path), edit, key=evidence_signing_key())
    assert failure(tampered, public_key) == (
        f"anchors.json lists anchors/{anchor.position}.tsr for two anchors"
    )


def test_two_tokens_at_one_position_verify(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    """Two anchorings can meet the same head: the second token is named for its position
    too (``-2``), and both verify."""
    anchor = ledger_anchor()
    again = LedgerAnchor.objects.create(
        **{
            field: getattr(anchor, field)
            for field in ("position", "event_id", "chain_hash", "token", "token_sha256")
        },
        tsa_url=anchor.tsa_url,
        gen_time=anchor.gen_time,
        created_at=timezone.now(),
    )
    broker_event()
    exported = export(cycle, tmp_path)
    with zipfile.ZipFile(exported) as archive:
        assert f"anchors/{again.position}-2.tsr" in archive.namelist()
    result = verify_pack(
        exported, public_key_pem=public_key.read_bytes(), tsa_certificates=authority(tsa)
    )
    assert result.ok, result.failure


@pytest.mark.parametrize(
    ("gen_time", "reason"),
    [
        (b"00000101000000", "year 0 is out of range"),
        (b"20261399000000", "Malformed TimestampToken: ASN.1 parsing error: invalid value"),
    ],
    ids=["year-0", "month-13"],
)
def test_a_token_whose_time_is_no_date_is_one_clear_failure(
    cycle: DropCycle,
    tsa: TsaSimulator,
    tmp_path: Path,
    public_key: Path,
    gen_time: bytes,
    reason: str,
) -> None:
    """Its signature is not checked without --tsa-cert, so anyone can write its time."""
    ledger_seal()
    head = LedgerChainLink.objects.order_by("-position").first()
    assert head is not None
    token = tsa.timestamp(head.chain_hash)
    written = re.search(rb"\x18\x0f(\d{14})Z", token)  # its GeneralizedTime
    assert written is not None
    token = token[: written.start(1)] + gen_time + token[written.end(1) :]
    anchor = LedgerAnchor.objects.create(
        position=head.position,
        event_id=head.event_id,
        chain_hash=head.chain_hash,
        token=token,
        token_sha256=hashlib.sha256(token).hexdigest(),
        tsa_url=tsa.url,
        gen_time=timezone.now(),
        created_at=timezone.now(),
    )
    broker_event()

    result = verify_pack(export(cycle, tmp_path), public_key_pem=public_key.read_bytes())

    assert result.failure == (
        f"anchors/{anchor.position}.tsr (position {anchor.position}): not an RFC 3161 "
        f"time-stamp token: {reason}"
    )


def test_evidence_verify_checks_tokens_offline_with_the_tsa_certificate(
    cycle: DropCycle, tsa: TsaSimulator, tmp_path: Path, public_key: Path
) -> None:
    ledger_anchor()
    broker_event()
    exported = export(cycle, tmp_path)
    ca = tmp_path / "tsa-ca.pem"
    ca.write_bytes(tsa.ca_pem)
    offline = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    verify = [sys.executable, "manage.py", "evidence", "verify", str(exported)]
    verified = subprocess.run(  # noqa: S603
        [*verify, "--public-key", str(public_key), "--tsa-cert", str(ca)],
        cwd=ROOT,
        env=offline,
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stderr
    assert "each signature chains to the given certificate" in verified.stdout

    not_a_cert = tmp_path / "not-a-cert.pem"
    not_a_cert.write_text("hello")
    refused = subprocess.run(  # noqa: S603
        [*verify, "--tsa-cert", str(not_a_cert)],
        cwd=ROOT,
        env=offline,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"{not_a_cert}: not a certificate")


_WITHOUT_RFC3161_CLIENT = """
import importlib.abc, runpy, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'rfc3161_client', 'django', 'psycopg'}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Blocked())
sys.argv = ['verify'] + sys.argv[1:]
runpy.run_module('integrations.evidence.verify', run_name='__main__')
"""


def test_a_pack_without_tokens_verifies_with_cryptography_alone(
    evidence_pack: Path, public_key: Path
) -> None:
    """An auditor who installed only ``cryptography`` (older packs, packs of a service with
    no authority) is not stopped by the time-stamp code."""
    exported = evidence_pack  # read only
    ran = subprocess.run(  # noqa: S603
        [sys.executable, "-c", _WITHOUT_RFC3161_CLIENT, str(exported), "--public-key",
         str(public_key)],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "no time-stamp token in the ledger range" in ran.stdout
