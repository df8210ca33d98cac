"""``ledger export``: streaming CSV/JSONL with broker and date filters."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.ledger_hash import event_hash
from integrations.ledger_kinds import LedgerKind
from integrations.services import ledger as ledger_services
from integrations.services.ledger import ledger_event_append, ledger_seal
from tests.builders import BrokerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def events() -> None:
    BrokerFactory.create(broker_id="4821")
    BrokerFactory.create(broker_id="1234")
    ledger_event_append(
        kind=LedgerKind.BROKER_CREATED, broker_id="4821", subject="x", data={"n": 1}
    )
    ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id="1234", subject="=HYPERLINK(1)")
    ledger_seal()
    ledger_event_append(kind=LedgerKind.API_KEY_CREATED, broker_id="4821")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger", "export", *args, stdout=out)
    return out.getvalue()


def without_exports(text: str) -> str:
    """An export's lines but the ``ledger.exported`` events each export writes first."""
    return "".join(line for line in text.splitlines(True) if "ledger.exported" not in line)


def test_csv_has_every_event_with_its_chain_hash(events: None) -> None:
    rows = list(csv.DictReader(io.StringIO(run())))
    assert [r["kind"] for r in rows] == [
        "broker.created",
        "broker.updated",
        "api_key.created",
        "ledger.exported",  # its own, written first: who took the ledger, and how
    ]
    assert rows[3]["subject"] == "command"
    assert rows[3]["actor"].startswith("cli")  # the account that ran it, where it has a name
    assert json.loads(rows[3]["data"]) == {
        "filters": {"broker": None, "out": None, "since": None, "until": None},
        "format": "csv",
        "via": "command",
    }
    assert len(rows[0]["chain_hash"]) == 64
    assert rows[2]["chain_hash"] == ""  # written after the seal
    assert json.loads(rows[0]["data"]) == {"n": 1}


def test_csv_defuses_formulas(events: None) -> None:
    rows = list(csv.DictReader(io.StringIO(run())))
    assert rows[1]["subject"] == "'=HYPERLINK(1)"


def test_every_event_hash_recomputes_from_the_jsonl_export(events: None) -> None:
    # A subject the CSV defuses ("@ops", a staff account Django accepts) is exact here.
    ledger_event_append(kind=LedgerKind.STAFF_USER_ADDED, subject="@ops", actor="staff:root")
    ledger_seal()
    rows = [json.loads(line) for line in run("--format", "jsonl").splitlines()]
    assert len(rows) == 5  # and the export's own event
    for row in rows:
        recomputed = event_hash(
            created_at=dt.datetime.fromisoformat(row["created_at"]),
            broker_id=row["broker_id"],
            kind=row["kind"],
            subject=row["subject"],
            actor=row["actor"],
            data=row["data"],
        )
        assert recomputed == row["event_hash"], row["subject"]
    # The CSV is for spreadsheets: the same cells are defused there (the docs say so).
    csv_subjects = [r["subject"] for r in csv.DictReader(io.StringIO(run()))]
    assert csv_subjects[1:4] == ["'=HYPERLINK(1)", "", "'@ops"]


def test_jsonl_filtered_by_broker(events: None) -> None:
    lines = [json.loads(line) for line in run("--format", "jsonl", "--broker", "4821").splitlines()]
    assert [e["kind"] for e in lines] == ["broker.created", "api_key.created"]
    assert lines[0]["data"] == {"n": 1}


def test_date_filters(events: None) -> None:
    assert run("--format", "jsonl", "--until", "2000-01-01") == ""
    assert len(without_exports(run("--format", "jsonl", "--since", "2000-01-01")).splitlines()) == 3


def test_dates_are_days_of_drops_calendar(monkeypatch: pytest.MonkeyPatch) -> None:
    # 03:00 UTC on July 2 is still July 1 in California, the day DROP counts it in.
    late = dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC)
    monkeypatch.setattr(ledger_services, "timezone", SimpleNamespace(now=lambda: late))
    ledger_event_append(kind=LedgerKind.BROKER_CREATED, broker_id="4821", subject="late")

    def subjects(*dates: str) -> list[str]:
        exported = without_exports(run("--format", "jsonl", *dates))
        return [json.loads(line)["subject"] for line in exported.splitlines()]

    assert subjects("--since", "2026-07-01", "--until", "2026-07-01") == ["late"]
    assert subjects("--since", "2026-07-02") == []
    assert subjects("--until", "2026-06-30") == []
    assert subjects("--since", "2026-07-01T19:59", "--until", "2026-07-01T20:01") == ["late"]
    # A date in ISO's basic form is the same day, the whole of it: not the midnight that
    # starts it (an exclusive bound that would leave the day out).
    assert subjects("--since", "20260701", "--until", "20260701") == ["late"]
    assert subjects("--since", "20260702") == []


def test_out_file(events: None, tmp_path: Path) -> None:
    target = tmp_path / "ledger.csv"
    run("--out", str(target))
    assert target.read_text().startswith("id,created_at,broker_id")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # A typo is an error, not an empty export.
        (["--broker", "9999"], "no broker with id '9999'"),
        (["--since", "yesterday"], "not a date: 'yesterday'"),
        (["--since", "2026-03-13", "--until", "2026-03-12"], "--until must be after --since"),
        # Dates, but at the calendar's edges: the whole of the last day ends past what a
        # time can hold. Not "not a date".
        (
            ["--until", "9999-12-31"],
            r"^'9999-12-31' is past the last date supported: give "
            "one from 0001-01-02 to 9999-12-30$",
        ),
        (["--since", "9999-12-31T23:59"], r"'9999-12-31T23:59' is past the last date"),
        (["--since", "0001-01-01T00:00+05:00"], r"is before the first date supported"),
    ],
)
def test_bad_arguments_are_one_clear_error(
    events: None, tmp_path: Path, args: list[str], message: str
) -> None:
    target = tmp_path / "ledger.csv"
    assert run("--format", "jsonl", "--broker", "4821")  # the same export, well asked, has rows
    with pytest.raises(CommandError, match=message) as refused:
        run(*args, "--out", str(target))
    assert "\n" not in str(refused.value)
    assert not target.exists()


def test_the_last_date_supported_ends_a_period(events: None) -> None:
    assert run("--since", "2026-01-01", "--until", "9999-12-30").startswith("id,created_at")


def test_an_export_that_fails_part_way_leaves_no_file(
    events: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written under a temporary name and renamed when complete: a file that is there is
    whole, which an auditor handed it must be able to rely on."""
    from integrations.management.commands import ledger as command

    events_of = command.ledger_events

    def rows_then_failure(**filters: Any) -> Iterator[Any]:
        yield from list(events_of(**filters))[:1]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(command, "ledger_events", rows_then_failure)
    out = tmp_path / "ledger.csv"

    with pytest.raises(OSError, match="No space left"):
        call_command("ledger", "export", "--out", str(out), stdout=io.StringIO())

    assert list(tmp_path.iterdir()) == []


def test_an_export_failing_after_another_to_the_same_file_leaves_that_one_whole(
    events: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two exports to one file at once (two operators, two scheduled jobs): each writes under
    a name of its own, so the one that fails part way never leaves its rows in the file the
    other one finished."""
    from integrations.management.commands import ledger as command

    events_of = command.ledger_events
    out = tmp_path / "ledger.csv"
    whole = without_exports(run("--format", "csv"))
    calls = {"n": 0}

    def second_export_then_failure(**filters: Any) -> Iterator[Any]:
        calls["n"] += 1
        if calls["n"] > 1:  # the other export: as it is
            yield from events_of(**filters)
            return
        yield from list(events_of(**filters))[:1]
        call_command("ledger", "export", "--out", str(out), stdout=io.StringIO())
        assert without_exports(out.read_bytes().decode()) == whole
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(command, "ledger_events", second_export_then_failure)

    with pytest.raises(OSError, match="No space left"):
        call_command(
            "ledger", "export", "--format", "jsonl", "--out", str(out), stdout=io.StringIO()
        )

    assert without_exports(out.read_bytes().decode()) == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.csv"]


def test_an_out_that_is_a_directory_is_one_error_and_leaves_nothing(
    events: None, tmp_path: Path
) -> None:
    taken = tmp_path / "ledger.csv"
    taken.mkdir()

    with pytest.raises(CommandError, match=r"--out .*ledger\.csv is a folder"):
        call_command("ledger", "export", "--out", str(taken), stdout=io.StringIO())

    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.csv"]  # no .partial
