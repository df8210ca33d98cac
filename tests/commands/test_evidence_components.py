"""The evidence pack laid out by the audit's nine components, and its sample.

The pack is exported from the cycle of ``tests/evidence_world.py``; each component's test is
broken on purpose (a wrong hash function, a long gap between downloads, a notice never
sent) and the pack names it, while still verifying: it is authentic, and it records the
failure. Editing ``components.json`` or a sampled story fails the verification.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import hashlib
import io
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from devtools.drop_simulator import DropSimulator, work_items
from integrations.consumers import readers
from integrations.drop import standardize
from integrations.drop.calendar import drop_date, drop_midnight, drop_today
from integrations.evidence import pack
from integrations.evidence.components import FILE, KEYS, TITLES, component_problems
from integrations.evidence.verify import main as verify_main
from integrations.evidence.verify import verify_pack
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    CycleState,
    DropCycle,
    LedgerEvent,
    Reappearance,
    ReportFile,
    WorkItem,
    WorkItemState,
)
from integrations.selectors import pulls
from integrations.services import ledger as ledger_services
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.evidence import components as builders
from integrations.services.evidence.evidence import evidence_signing_key
from integrations.services.ledger import ledger_event_append
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import report_file_mark_uploaded
from integrations.services.staff.brokers import broker_create
from tests.builders import DropAccessObligationFactory, DropCycleFactory, drop_zip, write_zip
from tests.commands.test_evidence import failure, members, rewrite
from tests.evidence_world import DROP_KEY, evidence_world
from tests.services.test_matching import register_late

pytestmark = pytest.mark.django_db


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


def export(tmp_path: Path, *args: str, name: str = "pack.zip") -> Path:
    out = tmp_path / name
    call_command(
        "evidence", "export", "--broker", "4821", *(args or ("--cycle", "1")),
        "--out", str(out), stdout=io.StringIO(),
    )  # fmt: skip
    return out


def components_of(path: Path) -> dict[str, Any]:
    document = json.loads(members(path)[FILE])
    return dict(document["components"])


def test_the_pack_holds_every_component_with_a_summary_section_each(
    cycle: DropCycle, tmp_path: Path, public_key: Path
) -> None:
    out = export(tmp_path)
    files = members(out)
    document = json.loads(files[FILE])
    assert document["format"] == "dropportal-components/1"
    assert tuple(document["components"]) == KEYS
    assert component_problems(document, set(files)) == []
    components = document["components"]
    for key in ("standardization", "hashing", "suppression_list", "service_providers"):
        assert components[key]["result"] == "pass", components[key]
    for component in components.values():
        assert component["proves"] and component["cannot_prove"] and component["tests"]
    reporting = components["status_reporting"]
    assert reporting["records"]["cycles"][0]["cycle"] == "1"
    assert reporting["records"]["files_by_state"] == {"accepted": 2}
    assert reporting["records"]["report_file_events"]["report_file.approved"] == 0
    assert "drop/1/20261120_4821_Email.csv" in reporting["files"]
    # Like every file, components.json is in the manifest, with the results it holds.
    manifest = json.loads(files[pack.MANIFEST])
    assert FILE in {entry["name"] for entry in manifest["files"]}
    assert manifest["components"]["results"] == {k: c["result"] for k, c in components.items()}
    summary = files[pack.SUMMARY].decode()
    for key, title in TITLES.items():
        assert f'<section class="component" id="{key}">' in summary
        assert f"<h3>{title}: " in summary
    assert "This pack proves:" in summary and "It cannot prove:" in summary

    result = verify_pack(out, public_key_pem=public_key.read_bytes())
    assert result.ok, result.failure
    assert result.components is not None and tuple(result.components) == KEYS
    assert result.components["hashing"] == {
        "title": "Hashing",
        "result": "pass",
        "failed_tests": [],
    }
    assert "component hashing: pass" in result.checks
    event = LedgerEvent.objects.get(kind="evidence.exported")
    assert event.data["components"] == manifest["components"]["results"]


def test_a_wrong_hash_function_fails_hashing_and_the_pack_still_verifies(
    cycle: DropCycle,
    tmp_path: Path,
    public_key: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def sha1_hash(standardized: str) -> str:  # a plausible mistake: the wrong digest
        return hashlib.sha1(standardized.encode()).hexdigest()  # noqa: S324

    monkeypatch.setattr(standardize, "hash_value", sha1_hash)
    out = export(tmp_path)
    components = components_of(out)
    assert components["hashing"]["result"] == "fail"
    assert components["standardization"]["result"] == "pass"
    (test,) = components["hashing"]["tests"]
    assert test["result"] == "fail"
    assert "expected 91hIbrbzNeqHs3o81O5yNrXUj7wDd2shvZ6THKi9qz8=, computed " in test["detail"]
    vectors = json.loads(members(out)["components/hashing_vectors.json"])["vectors"]
    juan = next(v for v in vectors if v["input"] == "juanpablo")
    assert juan == {
        "step": "hash",
        "field": "first_name",
        "input": "juanpablo",
        "expected": "91hIbrbzNeqHs3o81O5yNrXUj7wDd2shvZ6THKi9qz8=",
        "computed": sha1_hash("juanpablo"),
        "result": "differs",
    }
    # Email hashes through its own fast path, which the replaced function does not touch.
    email = next(v for v in vectors if v["input"] == "Anna.Smith@Domain.com")
    assert email["result"] == "equal"

    # Authentic, and it records a failed test: verify exits 0 and names the component.
    monkeypatch.undo()
    capsys.readouterr()
    call_command("evidence", "verify", str(out), "--public-key", str(public_key), "--json")
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["ok"] and "hashing" in report["components_failed"]
    assert report["components"]["hashing"]["failed_tests"][0]["name"] == (
        "DROP's official hashes computed by the deployed code"
    )
    assert "component(s) failed their tests at export" in captured.err
    assert "hashing" in captured.err
    call_command("evidence", "verify", str(out), "--public-key", str(public_key))
    text = capsys.readouterr().out
    assert "--  component hashing: FAIL (DROP's official hashes computed" in text
    assert "ok  component standardization: pass" in text
    assert text.endswith("Evidence pack verified.\n")


@pytest.mark.parametrize(
    ("list_type", "given"),
    [("email", "Anna.Smith@Domain.com"), ("phone", "+1(415)555-9317")],
)
def test_a_wrong_digest_on_the_registration_path_fails_hashing(
    cycle: DropCycle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    list_type: str,
    given: str,
) -> None:
    """Consumers registered in clear are hashed by the readers' own digests, not by
    ``standardize.hash_value``: a mistake there (the value hashed as given, not standardized)
    would match nobody, and the hashing component must see it."""

    def unstandardized(value: str) -> bytes:
        return hashlib.sha256(value.encode()).digest()

    monkeypatch.setitem(readers.SIMPLE_DIGESTS, list_type, unstandardized)
    hashing = components_of(export(tmp_path))["hashing"]

    assert hashing["result"] == "fail"
    (test,) = hashing["tests"]
    assert f"{list_type} {json.dumps(given)}: expected " in test["detail"]
    vectors = json.loads(
        members(export(tmp_path, name="again.zip"))["components/hashing_vectors.json"]
    )["vectors"]
    registered = [v for v in vectors if v["step"] == "register" and v["input"] == given]
    assert [v["result"] for v in registered] == ["differs"]


@pytest.mark.parametrize("how", ["deleted", "marked removed"])
def test_a_hash_gone_from_the_suppression_list_fails_it(
    cycle: DropCycle, tmp_path: Path, how: str
) -> None:
    """The list is the work items DROP sent and did not remove: one deleted, or marked
    removed with no Removed file, leaves a deleted person off the list, and the imports' and
    removals' ledger events say how many should be on it."""
    suppression = components_of(export(tmp_path))["suppression_list"]
    assert suppression["result"] == "pass", suppression["tests"]
    kept = suppression["records"]["work_items_on_list"]
    assert kept == suppression["records"]["work_items_by_ledger"] == 8
    item = WorkItem.objects.filter(cycle=cycle, hash_type="phone").order_by("pk").first()
    assert item is not None
    with connection.cursor() as cursor:
        if how == "deleted":
            cursor.execute("DELETE FROM integrations_workitem WHERE id = %s", [item.pk])
        else:
            cursor.execute(
                "UPDATE integrations_workitem SET state = %s WHERE id = %s",
                [WorkItemState.REMOVED.value, item.pk],
            )

    suppression = components_of(export(tmp_path, name="again.zip"))["suppression_list"]

    assert suppression["records"]["work_items_on_list"] == kept - 1
    assert suppression["result"] == "fail"
    (test,) = [t for t in suppression["tests"] if t["result"] == "fail"]
    assert test["detail"] == (
        f"{kept - 1} work item(s) on the list; the ledger's imports and removals leave {kept}"
    )


def test_a_status_drop_holds_that_its_file_does_not_say_fails_status_reporting(
    cycle: DropCycle, tmp_path: Path
) -> None:
    """What DROP holds for a work item (its reported code, which the yearly figures count)
    must be the row of the file DROP accepted with it: a code changed in the database since
    makes the figures disagree with the files, and status reporting must say so."""
    reporting = components_of(export(tmp_path))["status_reporting"]
    assert reporting["result"] == "pass", reporting["tests"]
    item = WorkItem.objects.filter(cycle=cycle, reported_status_code=5).order_by("pk").first()
    assert item is not None and item.report_file_id is not None
    WorkItem.objects.filter(pk=item.pk).update(reported_status_code=3)

    reporting = components_of(export(tmp_path, name="again.zip"))["status_reporting"]

    assert reporting["result"] == "fail"
    (test,) = [t for t in reporting["tests"] if t["result"] == "fail"]
    assert test["name"] == "every status DROP holds is the one in the file DROP accepted"
    assert f"work item {item.work_item_id}" in test["detail"]


def test_a_reappearance_whose_event_falls_past_the_period_still_counts_as_ledgered(
    cycle: DropCycle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registration's reappearances are stamped when its transaction began, its
    consumers.reappeared event when it ends: an import running past the period's end puts
    them on two sides of it. The rows and the events are compared over all time, so neither
    pack blames the ledger for that."""
    matched = WorkItem.objects.filter(cycle=cycle, deletion_requests__isnull=False).first()
    assert matched is not None
    path = tmp_path / "supplier.csv"
    path.write_text(
        "remote_identifier,hash_type,hash\n"
        f"R-1,email,{base64.b64encode(bytes(matched.hash)).decode()}\n"
    )
    later = timezone.now() + dt.timedelta(days=2)  # the event, after the period's end
    with monkeypatch.context() as clock:
        clock.setattr(ledger_services, "timezone", SimpleNamespace(now=lambda: later))
        call_command(
            "consumers", "import", "--broker", "4821", "--hashed", str(path),
            stdout=io.StringIO(),
        )  # fmt: skip
    assert Reappearance.objects.count() == 1
    today = str(drop_today())

    suppression = components_of(export(tmp_path, "--since", today, "--until", today))[
        "suppression_list"
    ]

    assert suppression["records"]["reappearances"] == 1
    ledgered = next(t for t in suppression["tests"] if "on the ledger" in t["name"])
    assert ledgered["result"] == "pass", ledgered


def test_a_component_without_a_builder_is_there_failed(
    cycle: DropCycle, tmp_path: Path, public_key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(builders.BUILDERS, "suppression_list")
    out = export(tmp_path)
    component = components_of(out)["suppression_list"]
    assert component["result"] == "fail"
    assert component["tests"] == [
        {
            "name": "a builder for this component",
            "result": "fail",
            "detail": "no builder registered in this version",
        }
    ]
    result = verify_pack(out, public_key_pem=public_key.read_bytes())
    assert result.ok and "suppression_list" in result.components_failed


def test_an_edited_components_file_fails(
    cycle: DropCycle, tmp_path: Path, public_key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(standardize, "hash_value", lambda standardized: "wrong")
    out = export(tmp_path)

    def passed(files: dict[str, bytes]) -> None:
        files[FILE] = files[FILE].replace(b'"result": "fail"', b'"result": "pass"')

    assert failure(rewrite(out, passed), public_key) == (
        "components.json: its SHA-256 does not match the manifest"
    )
    # Even signed again by someone holding the key: a result is its tests', and the
    # manifest's results are the file's.
    resigned = rewrite(out, passed, key=evidence_signing_key())
    assert failure(resigned, public_key) == "components.json: its results are not the manifest's"

    def hashing_passed(files: dict[str, bytes]) -> None:
        files[FILE] = files[FILE].replace(
            b'"title": "Hashing",\n      "result": "fail"',
            b'"title": "Hashing",\n      "result": "pass"',
        )

    resigned = rewrite(out, hashing_passed, key=evidence_signing_key())
    assert failure(resigned, public_key) == (
        "components.json: hashing says 'pass' but its tests give 'fail'"
    )

    def without_components(files: dict[str, bytes]) -> None:
        del files[FILE]
        manifest = json.loads(files[pack.MANIFEST])
        manifest["files"] = [e for e in manifest["files"] if e["name"] != FILE]
        files[pack.MANIFEST] = json.dumps(manifest).encode()

    resigned = rewrite(out, without_components, key=evidence_signing_key())
    assert failure(resigned, public_key) == "components.json is missing, the manifest declares it"

    def files_a_number(files: dict[str, bytes]) -> None:
        document = json.loads(files[FILE])
        document["components"]["hashing"]["files"] = 3
        files[FILE] = json.dumps(document).encode()

    resigned = rewrite(out, files_a_number, key=evidence_signing_key())
    assert failure(resigned, public_key) == (
        "components.json: hashing's files are not a list of names"
    )


def test_the_verifier_rechecks_the_vectors_rather_than_trusting_the_pass(
    evidence_pack: Path, tmp_path: Path, public_key: Path
) -> None:
    """A pack whose hashing says pass while its own vectors file shows a computed hash that
    is not DROP's (a builder that lost a difference, or a key holder's edit) must not verify:
    the verifier compares each vector's expected and computed values itself."""
    out = Path(shutil.copyfile(evidence_pack, tmp_path / "pack.zip"))
    assert verify_pack(out, public_key_pem=public_key.read_bytes()).ok

    def one_vector_differs(files: dict[str, bytes]) -> None:
        name = "components/hashing_vectors.json"
        document = json.loads(files[name])
        document["vectors"][0]["computed"] = "wrong"  # still marked "equal"
        files[name] = json.dumps(document).encode()

    resigned = rewrite(out, one_vector_differs, key=evidence_signing_key())
    assert failure(resigned, public_key) == (
        "components/hashing_vectors.json: vector 1 (hash first_name) is marked 'equal' but "
        "its computed value is not the expected one (and 1 more)"
    )

    def marked_differs(files: dict[str, bytes]) -> None:
        name = "components/hashing_vectors.json"
        document = json.loads(files[name])
        document["vectors"][0]["computed"] = "wrong"
        document["vectors"][0]["result"] = "differs"
        files[name] = json.dumps(document).encode()

    resigned = rewrite(out, marked_differs, key=evidence_signing_key())
    assert failure(resigned, public_key) == (
        "components.json: hashing says 'pass' but components/hashing_vectors.json has 1 "
        "vector(s) that differ"
    )


def test_a_pack_from_before_the_components_still_verifies(
    evidence_pack: Path, tmp_path: Path, public_key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = Path(shutil.copyfile(evidence_pack, tmp_path / "pack.zip"))
    added = (FILE, "components/")

    def old_format(files: dict[str, bytes]) -> None:
        for name in [name for name in files if name.startswith(added)]:
            del files[name]
        manifest = json.loads(files[pack.MANIFEST])
        manifest["files"] = [e for e in manifest["files"] if not e["name"].startswith(added)]
        del manifest["components"]
        files[pack.MANIFEST] = json.dumps(manifest).encode()

    old = rewrite(out, old_format, key=evidence_signing_key())
    # Anyone holding the key can make a pack look this old: it fails unless the auditor,
    # who knows when it was exported, allows it.
    refused = verify_pack(old, public_key_pem=public_key.read_bytes())
    assert refused.failure == (
        "components.json is missing (a pack exported before packs were laid out by the "
        "audit's components verifies with --allow-pre-components)"
    )
    with pytest.raises(SystemExit) as exited:
        call_command("evidence", "verify", str(old), "--public-key", str(public_key))
    assert exited.value.code == 1
    capsys.readouterr()
    result = verify_pack(old, public_key_pem=public_key.read_bytes(), allow_pre_components=True)
    assert result.ok, result.failure
    assert result.components is None and result.components_failed == []
    assert any(
        line.startswith("components: none (components.json is not in this pack")
        for line in result.checks
    )
    call_command(
        "evidence", "verify", str(old), "--public-key", str(public_key), "--json",
        "--allow-pre-components",
    )  # fmt: skip
    assert json.loads(capsys.readouterr().out)["components"] is None


def test_a_gap_of_more_than_45_days_between_downloads_fails_drop_access(
    cycle: DropCycle, tmp_path: Path
) -> None:
    now = timezone.now()
    DropCycle.objects.filter(pk=cycle.pk).update(downloaded_at=now - dt.timedelta(days=60))
    DropCycleFactory.create(
        broker=cycle.broker, drop_session_id="2", match_date=(now - dt.timedelta(days=14)).date()
    )
    drop_access = components_of(export(tmp_path))["drop_access"]
    assert drop_access["result"] == "fail"
    gap = drop_access["tests"][0]
    assert gap["name"] == "a download at least every 45 days" and gap["result"] == "fail"
    assert 45 < drop_access["records"]["longest_gap_days"] < 47

    # Within the cadence, it passes.
    DropCycle.objects.filter(drop_session_id="2").update(downloaded_at=now - dt.timedelta(days=20))
    drop_access = components_of(export(tmp_path, name="again.zip"))["drop_access"]
    assert drop_access["tests"][0]["result"] == "pass"
    assert drop_access["records"]["longest_gap_days"] == 40.0


@pytest.mark.parametrize(
    ("previous", "next_", "result"),
    [
        # 45 days and 21 hours, but the 45th day of DROP's calendar: on time.
        ((60, 1), (15, 22), "pass"),
        # Hardly 45 days and two hours, but on the 46th day: late.
        ((61, 23), (15, 1), "fail"),
    ],
)
def test_the_gap_between_downloads_is_counted_in_drop_calendar_days(
    cycle: DropCycle,
    tmp_path: Path,
    previous: tuple[int, int],
    next_: tuple[int, int],
    result: str,
) -> None:
    """As the download-due alert counts it: a download is on time through the 45th day of
    DROP's calendar after the one before, whatever its hour."""

    def at(days_ago: int, hour: int) -> dt.datetime:
        return drop_midnight(drop_today() - dt.timedelta(days=days_ago)) + dt.timedelta(hours=hour)

    DropCycle.objects.filter(pk=cycle.pk).update(downloaded_at=at(*previous))
    DropCycleFactory.create(broker=cycle.broker, drop_session_id="2", downloaded_at=at(*next_))

    drop_access = components_of(export(tmp_path))["drop_access"]

    assert drop_access["tests"][0]["result"] == result, drop_access["tests"][0]
    records = drop_access["records"]
    assert records["longest_gap_drop_days"] == previous[0] - next_[0]
    assert dt.datetime.fromisoformat(records["longest_gap"]["from"]) == at(*previous)


@pytest.fixture
def duty_long_begun(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cadence's own rule, whatever today is: these packs' times reach back months, to
    before the duty to download began (``test_no_gap_counts_from_before_the_duty...``)."""
    monkeypatch.setattr(pulls, "DOWNLOAD_DUTY_BEGINS", dt.date(2000, 1, 1))


def set_up_days_ago(days: int, monkeypatch: pytest.MonkeyPatch) -> Broker:
    """Broker 4821, set up in the service ``days`` ago (its first ledger event then)."""
    at = timezone.now() - dt.timedelta(days=days)
    with monkeypatch.context() as clock:
        clock.setattr(ledger_services, "timezone", SimpleNamespace(now=lambda: at))
        return broker_create(broker_id="4821", name="Acme Data", mode="test", actor="test")


@pytest.mark.parametrize(("days", "result"), [(200, "fail"), (30, "pass")])
def test_a_broker_that_never_reached_drop_has_one_long_gap(
    duty_long_begun: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, days: int, result: str
) -> None:
    """No download at all is no proof of access: the pack's whole time is the gap."""
    set_up_days_ago(400, monkeypatch)
    today = drop_today()
    since, until = str(today - dt.timedelta(days=days)), str(today - dt.timedelta(days=1))
    drop_access = components_of(export(tmp_path, "--since", since, "--until", until))["drop_access"]
    gap = drop_access["tests"][0]
    assert gap["result"] == result, gap
    assert gap["detail"].endswith("no download at all: the broker has not reached DROP")
    # California's days, both included: a change of clocks between them is an hour more or less.
    assert abs(drop_access["records"]["longest_gap_days"] - days) <= 0.05
    assert drop_access["records"]["longest_gap"]["to"] == "open at the end"


@pytest.mark.parametrize(("set_up", "result", "gap"), [(300, "fail", 170), (40, "pass", 30)])
def test_the_time_before_a_first_download_late_in_the_pack_is_a_gap(
    duty_long_begun: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    set_up: int,
    result: str,
    gap: int,
) -> None:
    """A first download near the end of a long pack does not make the months before it
    vanish; the time before the broker was set up in the service is not counted."""
    broker = set_up_days_ago(set_up, monkeypatch)
    today = drop_today()
    # At noon in California: the gap then holds half a day more whatever the hour the test
    # runs (at 23:00 it held a whole day more, and a change of clocks another hour).
    noon = drop_midnight(today - dt.timedelta(days=30)) + dt.timedelta(hours=12)
    DropCycleFactory.create(broker=broker, downloaded_at=noon)
    since, until = str(today - dt.timedelta(days=200)), str(today - dt.timedelta(days=1))

    drop_access = components_of(export(tmp_path, "--since", since, "--until", until))["drop_access"]

    assert drop_access["tests"][0]["result"] == result, drop_access["tests"][0]
    assert gap - 1 < drop_access["records"]["longest_gap_days"] < gap + 1


def test_no_gap_counts_from_before_the_duty_to_download_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The duty to download every 45 days begins on 1 August 2026: a pack from June 1 whose
    first download is on August 1 has no gap before it, nor between two downloads before
    and after that day beyond the time since August 1."""
    june_1 = drop_midnight(dt.date(2026, 6, 1))
    with monkeypatch.context() as clock:
        clock.setattr(ledger_services, "timezone", SimpleNamespace(now=lambda: june_1))
        broker = broker_create(broker_id="4821", name="Acme Data", mode="test", actor="test")
    noon = dt.timedelta(hours=12)
    DropCycleFactory.create(
        broker=broker, drop_session_id="1", downloaded_at=drop_midnight(dt.date(2026, 8, 1)) + noon
    )
    since, until = "2026-06-01", "2026-09-10"

    drop_access = components_of(export(tmp_path, "--since", since, "--until", until))["drop_access"]

    assert drop_access["tests"][0]["result"] == "pass", drop_access["tests"][0]
    # The longest is the one still open: August 1 to September 10, both included.
    assert drop_access["records"]["longest_gap_drop_days"] == 40

    # A download on July 1 and the next on September 5: 35 days of the duty, not 66.
    DropCycle.objects.filter(drop_session_id="1").update(
        downloaded_at=drop_midnight(dt.date(2026, 7, 1)) + noon
    )
    DropCycleFactory.create(
        broker=broker, drop_session_id="2", downloaded_at=drop_midnight(dt.date(2026, 9, 5)) + noon
    )
    drop_access = components_of(export(tmp_path, "--since", since, "--until", until, name="b.zip"))[
        "drop_access"
    ]
    assert drop_access["tests"][0]["result"] == "pass", drop_access["tests"][0]
    assert drop_access["records"]["longest_gap_drop_days"] == 35
    opened = dt.datetime.fromisoformat(drop_access["records"]["longest_gap"]["from"])
    assert opened == drop_midnight(dt.date(2026, 8, 1))


def test_a_pull_that_resumed_a_package_downloaded_before_is_no_download_of_its_own(
    cycle: DropCycle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = timezone.now()
    DropCycle.objects.filter(pk=cycle.pk).update(downloaded_at=now - dt.timedelta(days=60))
    for days, resumed in ((30, True), (20, False)):
        at = now - dt.timedelta(days=days)
        with monkeypatch.context() as clock:
            clock.setattr(ledger_services, "timezone", SimpleNamespace(now=lambda at=at: at))
            ledger_event_append(
                kind=LedgerKind.DROP_PULLED,
                broker_id=cycle.broker.broker_id,
                data={"outcome": "already_imported", **({"resumed": True} if resumed else {})},
            )

    drop_access = components_of(export(tmp_path))["drop_access"]

    # 60 days ago to 20 days ago: the resumed pull, 30 days ago, reached no DROP.
    assert drop_access["records"]["longest_gap_days"] == 40.0


def test_an_outage_without_its_notice_fails_drop_access(cycle: DropCycle, tmp_path: Path) -> None:
    # An hour before midnight in California: UTC's date is already the next day's, and the
    # outage's day, as its due date, is DROP's.
    start = drop_midnight(drop_date(cycle.downloaded_at) + dt.timedelta(days=1)) - dt.timedelta(
        hours=1
    )
    assert start.astimezone(dt.UTC).date() != drop_date(start)
    obligation = DropAccessObligationFactory.create(
        broker=cycle.broker,
        outage__started_at=start,
        outage__ended_at=start + dt.timedelta(days=2),
        # DROP's yesterday, not the server's: between midnight UTC and midnight in California
        # the two differ, and the component judges by DROP's calendar.
        due_date=drop_today() - dt.timedelta(days=1),
    )
    notice = components_of(export(tmp_path))["drop_access"]["tests"][1]
    assert notice["result"] == "fail"
    assert notice["detail"] == (
        f"the outage from {drop_date(start)} needed one by {obligation.due_date}: none recorded"
    )


def _drawn(seed: str, size: int) -> list[str]:
    """The sample as the documented method draws it, computed here on its own."""
    ids = WorkItem.objects.filter(cycle__drop_session_id="1").values_list("work_item_id", flat=True)
    keyed = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:1:{i}".encode()).hexdigest())
    return keyed[:size]


def test_the_sample_is_drawn_by_its_seed_each_story_a_page(
    cycle: DropCycle, tmp_path: Path, public_key: Path
) -> None:
    first = export(tmp_path, "--cycle", "1", "--sample", "3", "--seed", "audit-2028")
    again = export(tmp_path, "--cycle", "1", "--sample", "3", "--seed", "audit-2028", name="b.zip")
    other = export(tmp_path, "--cycle", "1", "--sample", "3", "--seed", "another", name="c.zip")

    def sample(path: Path) -> dict[str, Any]:
        return dict(json.loads(members(path)[pack.MANIFEST])["sample"])

    drawn = sample(first)
    assert (drawn["seed"], drawn["size"], drawn["drawn"], drawn["population"]) == (
        "audit-2028", 3, 3, 8,
    )  # fmt: skip
    items = drawn["work_items"]
    assert [item["work_item_id"] for item in items] == _drawn("audit-2028", 3)
    assert sample(again)["work_items"] == items
    assert [item["work_item_id"] for item in sample(other)["work_items"]] == _drawn("another", 3)
    assert _drawn("another", 3) != _drawn("audit-2028", 3)

    files = members(first)
    for item in items:
        page = files[f"sample/{item['work_item_id']}.html"].decode()
        assert f"Work item {item['work_item_id']}, cycle 1" in page
        assert "DROP sent it in cycle 1" in page and "ledger event " in page
        assert "household@example.com" not in page  # no clear identifier
    summary = files[pack.SUMMARY].decode()
    assert "<h2>Sample</h2>" in summary and "audit-2028" in summary
    result = verify_pack(first, public_key_pem=public_key.read_bytes())
    assert result.ok, result.failure
    assert (
        "sample: 3 stories drawn with seed 'audit-2028', each page as exported; drawn again "
        "from the 8 work items of sample_population.csv, the same items in the same order"
    ) in result.checks
    event = LedgerEvent.objects.filter(kind="evidence.exported").order_by("id").first()
    assert event is not None
    assert event.data["sample"] == {"seed": "audit-2028", "size": 3, "drawn": 3}

    # An edited story fails, however small the change.
    name = f"sample/{items[0]['work_item_id']}.html"

    def edit(files: dict[str, bytes]) -> None:
        files[name] = files[name].replace(b"DROP sent it", b"DROP sent It", 1)

    assert failure(rewrite(first, edit), public_key) == (
        f"{name}: its SHA-256 does not match the manifest"
    )


def test_a_sample_needs_its_seed(cycle: DropCycle, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="give --sample and --seed together"):
        export(tmp_path, "--cycle", "1", "--sample", "3")
    assert list(tmp_path.glob("pack.zip*")) == []


@pytest.mark.parametrize("size", ["0", "10001", "99999999999999999999"])  # the last past a bigint
def test_a_sample_size_out_of_bounds_is_refused(
    cycle: DropCycle, tmp_path: Path, size: str
) -> None:
    with pytest.raises(CommandError, match="--sample must be 1 to 10,000 work items"):
        export(tmp_path, "--cycle", "1", "--sample", size, "--seed", "s")
    assert list(tmp_path.glob("pack.zip*")) == []
    assert not LedgerEvent.objects.filter(kind="evidence.exported").exists()


def test_a_file_approved_by_its_own_writer_fails_status_reporting(
    cycle: DropCycle, tmp_path: Path
) -> None:
    def decisions() -> dict[str, Any]:
        status = components_of(export(tmp_path, name=f"{LedgerEvent.objects.count()}.zip"))
        return dict(status["status_reporting"]["tests"][1])

    assert decisions()["result"] == "pass"
    # The service refuses this (services/reporting/report_approval.py); written behind its
    # back, the pack names it: the same person under the admin's and the shell's names.
    ledger_event_append(
        kind=LedgerKind.REPORT_FILE_APPROVED,
        broker_id="4821",
        subject="4821_1_email.csv",
        actor="cli:alice",
        data={"written_by": "staff:alice"},
    )
    failed = decisions()
    assert failed["result"] == "fail"
    assert failed["detail"] == "decided by their own writer: 4821_1_email.csv"


@pytest.mark.parametrize(
    ("rows", "state", "verdict", "result"),
    [
        ([], CycleState.NOTHING_OWED, "nothing owed", "pass"),
        ([("1", "a" * 64)], CycleState.OPEN, "overdue", "fail"),
    ],
    ids=["empty-package", "one-row-unreported"],
)
def test_a_cycle_that_owed_nothing_is_not_overdue(
    broker: Broker,
    tmp_path: Path,
    public_key: Path,
    rows: list[tuple[str, str]],
    state: str,
    verdict: str,
    result: str,
) -> None:
    # Downloaded on August 1 (the package's date): due September 15, long past. DROP owes no
    # status for an empty file, so a package of empty lists is never reported.
    package = drop_zip(broker, {"Email": rows, "Phone": []}, date="20260801")
    imported = drop_zip_import(
        broker=broker,
        path=write_zip(tmp_path, package, name="20260801_4821_DROP.zip"),
        actor="test",
    )
    cycle = imported.cycle
    assert (cycle.state, cycle.due_date < drop_today()) == (state, True)

    out = export(tmp_path, "--cycle", cycle.drop_session_id)
    reporting = components_of(out)["status_reporting"]
    assert reporting["records"]["cycles"][0]["deadline"] == verdict
    deadline = reporting["tests"][0]
    assert deadline["result"] == result, deadline["detail"]
    assert f"<td>{verdict}</td>" in members(out)[pack.SUMMARY].decode()
    assert verify_pack(out, public_key_pem=public_key.read_bytes()).ok


def test_a_file_uploaded_by_hand_on_the_due_date_and_marked_next_morning_met_it(
    broker: Broker, tmp_path: Path, public_key: Path
) -> None:
    # Downloaded 46 days ago: due yesterday. Staff uploaded the file in DROP's portal that
    # evening and marked it uploaded today, giving the upload's time.
    downloaded = drop_today() - dt.timedelta(days=46)
    unknown = base64.b64encode(hashlib.sha256(b"nobody@example.com").digest()).decode()
    package = drop_zip(broker, {"Email": [("1", unknown)]}, date=f"{downloaded:%Y%m%d}")
    cycle = drop_zip_import(
        broker=broker,
        path=write_zip(tmp_path, package, name=f"{downloaded:%Y%m%d}_4821_DROP.zip"),
        actor="test",
    ).cycle
    assert cycle.due_date == drop_today() - dt.timedelta(days=1)
    (email,) = report_files_write(broker=broker, cycle=cycle)
    ReportFile.objects.filter(pk=email.pk).update(created_at=drop_midnight(cycle.due_date))
    uploaded = drop_midnight(cycle.due_date) + dt.timedelta(hours=21, minutes=30)

    report_file_mark_uploaded(report_file=email, actor="staff:alice", uploaded_at=uploaded)

    out = export(tmp_path, "--cycle", cycle.drop_session_id)
    (record,) = components_of(out)["status_reporting"]["records"]["cycles"]
    assert (record["deadline"], dt.datetime.fromisoformat(record["all_reported_at"])) == (
        "met",
        uploaded,
    )
    assert verify_pack(out, public_key_pem=public_key.read_bytes()).ok


MATCHING = "components/matching/1.json"


def _matching_edited(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, bytes]], None]:
    def change(files: dict[str, bytes]) -> None:
        document = json.loads(files[MATCHING])
        edit(document)
        files[MATCHING] = json.dumps(document).encode()

    return change


def test_the_verifier_rechecks_the_matching_files_rather_than_trusting_the_pass(
    evidence_pack: Path, tmp_path: Path, public_key: Path
) -> None:
    """components.json says matching passed; a key holder's file that holds unexplained
    differences, or says it failed, must not verify beside it."""
    out = Path(shutil.copyfile(evidence_pack, tmp_path / "pack.zip"))
    assert components_of(out)["matching"]["result"] == "pass"
    key = evidence_signing_key()

    def failed(document: dict[str, Any]) -> None:
        document["unexplained"] = {"match_not_recorded": 1}
        document["result"] = "fail"

    assert failure(rewrite(out, _matching_edited(failed), key=key), public_key) == (
        f"components.json: matching says 'pass' but {MATCHING} says 'fail'"
    )

    def unexplained_but_pass(document: dict[str, Any]) -> None:
        document["unexplained"] = {"match_not_recorded": 1}

    assert failure(rewrite(out, _matching_edited(unexplained_but_pass), key=key), public_key) == (
        f"{MATCHING} says 'pass' but its unexplained differences give 'fail'"
    )

    def only_the_result(document: dict[str, Any]) -> None:
        document["result"] = "fail"

    assert failure(rewrite(out, _matching_edited(only_the_result), key=key), public_key) == (
        f"{MATCHING} says 'fail' but its unexplained differences give 'pass'"
    )

    def without_the_file(files: dict[str, bytes]) -> None:
        del files[MATCHING]
        manifest = json.loads(files[pack.MANIFEST])
        manifest["files"] = [e for e in manifest["files"] if e["name"] != MATCHING]
        files[pack.MANIFEST] = json.dumps(manifest).encode()
        document = json.loads(files[FILE])
        document["components"]["matching"]["files"] = []
        files[FILE] = json.dumps(document).encode()

    assert failure(rewrite(out, without_the_file, key=key), public_key) == (
        "components.json: matching says 'pass' without a matching file of cycle 1"
    )


def test_an_explained_difference_must_cite_an_event_of_the_ledger(
    cycle: DropCycle, tmp_path: Path, public_key: Path
) -> None:
    # A consumer registered after the import matches a work item late: the rematch finds
    # the difference, explained by the drop.late_matched event.
    _, unmatched_hash = list(work_items(8))[3]  # an email of the world no consumer held
    register_late(cycle.broker, "C-late", email=unmatched_hash)
    out = export(tmp_path)
    event = LedgerEvent.objects.get(kind="drop.late_matched")
    (example,) = json.loads(members(out)[MATCHING])["examples"]["late_match"]
    assert (example["explained"], example["event"]["id"]) == (True, event.pk)
    result = verify_pack(out, public_key_pem=public_key.read_bytes())
    assert result.ok, result.failure
    key = evidence_signing_key()

    def elsewhere(document: dict[str, Any]) -> None:
        document["examples"]["late_match"][0]["event"]["id"] = 10**9

    assert failure(rewrite(out, _matching_edited(elsewhere), key=key), public_key) == (
        f"{MATCHING} cites ledger event {10**9}, not in the pack"
    )
    imported = LedgerEvent.objects.get(kind="drop.cycle_imported")

    def another_kind(document: dict[str, Any]) -> None:
        document["examples"]["late_match"][0]["event"]["id"] = imported.pk

    assert failure(rewrite(out, _matching_edited(another_kind), key=key), public_key) == (
        f"{MATCHING} cites ledger event {imported.pk} as drop.late_matched, the ledger has "
        "drop.cycle_imported"
    )

    def uncounted(document: dict[str, Any]) -> None:
        document["explained"] = {}

    assert failure(rewrite(out, _matching_edited(uncounted), key=key), public_key) == (
        f"{MATCHING}: an example of late_match (work item {example['work_item_id']}) is not "
        "counted explained under late_match"
    )


def _population(files: dict[str, bytes]) -> list[list[str]]:
    return list(csv.reader(io.StringIO(files["sample_population.csv"].decode())))


def test_the_verifier_draws_the_sample_again_from_the_population_it_carries(
    cycle: DropCycle, tmp_path: Path, public_key: Path
) -> None:
    out = export(tmp_path, "--cycle", "1", "--sample", "2", "--seed", "S")
    files = members(out)
    ids = sorted(WorkItem.objects.filter(cycle=cycle).values_list("work_item_id", flat=True))
    population = _population(files)
    assert population[0] == ["cycle", "work_item_id"]
    assert sorted(population[1:]) == [["1", i] for i in ids]  # ids only, every work item
    manifest = json.loads(files[pack.MANIFEST])
    assert manifest["sample"]["population_file"] == "sample_population.csv"
    drawn = _drawn("S", 2)
    assert [item["work_item_id"] for item in manifest["sample"]["work_items"]] == drawn
    assert verify_pack(out, public_key_pem=public_key.read_bytes()).ok
    key = evidence_signing_key()
    undrawn = next(i for i in ids if i not in _drawn("S", len(ids) - 1))

    def swapped(files: dict[str, bytes]) -> None:
        # One sampled item swapped for one the seed does not draw, its page with it.
        page = files.pop(f"sample/{drawn[0]}.html")
        files[f"sample/{undrawn}.html"] = page
        manifest = json.loads(files[pack.MANIFEST])
        manifest["files"] = [e for e in manifest["files"] if e["name"] != f"sample/{drawn[0]}.html"]
        manifest["sample"]["work_items"][0] |= {
            "work_item_id": undrawn,
            "file": f"sample/{undrawn}.html",
        }
        files[pack.MANIFEST] = json.dumps(manifest).encode()

    assert failure(rewrite(out, swapped, key=key), public_key) == (
        f"sample: seed 'S' does not draw work item {undrawn} of cycle 1 from "
        f"sample_population.csv (it draws 2 items, the first {', '.join(drawn)})"
    )

    def steered(files: dict[str, bytes]) -> None:
        # The first drawn item left out of the population, so that the draw moves on.
        rows = [row for row in _population(files) if row[1] != drawn[0]]
        files["sample_population.csv"] = "".join(f"{c},{w}\n" for c, w in rows).encode()
        manifest = json.loads(files[pack.MANIFEST])
        redrawn = _drawn("S", 3)[1:]
        manifest["sample"]["population"] = len(rows) - 1
        for entry in manifest["files"]:
            if entry["name"] == "sample_population.csv":
                entry["rows"] = len(rows) - 1
        manifest["sample"]["work_items"] = [
            {"cycle": "1", "work_item_id": i, "file": f"sample/{i}.html"} for i in redrawn
        ]
        for name in [n for n in files if n.startswith("sample/")]:
            del files[name]
        manifest["files"] = [e for e in manifest["files"] if not e["name"].startswith("sample/")]
        for i in redrawn:
            files[f"sample/{i}.html"] = b"a story"
        files[pack.MANIFEST] = json.dumps(manifest).encode()

    assert failure(rewrite(out, steered, key=key), public_key) == (
        "sample: 1 work items of outcomes.csv or the DROP files are not in "
        "sample_population.csv, the population it is drawn from"
    )

    def from_before_the_population(files: dict[str, bytes]) -> None:
        del files["sample_population.csv"]
        manifest = json.loads(files[pack.MANIFEST])
        manifest["files"] = [e for e in manifest["files"] if e["name"] != "sample_population.csv"]
        del manifest["sample"]["population_file"]
        files[pack.MANIFEST] = json.dumps(manifest).encode()

    old = rewrite(out, from_before_the_population, key=key)
    assert failure(old, public_key) == (
        "sample: the pack does not carry the population it was drawn from (a pack exported "
        "before it did, without sample_population.csv, verifies with --allow-pre-population)"
    )
    allowed = verify_pack(old, public_key_pem=public_key.read_bytes(), allow_pre_population=True)
    assert allowed.ok, allowed.failure
    assert any("not drawn again (sample_population.csv" in line for line in allowed.checks)


def test_verify_documents_its_options_for_older_packs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        verify_main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "--allow-pre-components accept a pack without components.json" in said
    assert "--allow-pre-population accept a sample without sample_population.csv" in said
