"""``providers add|list|acknowledge`` and ``drop directives|directive``: registering service
providers, listing what they were directed to delete, writing a directive's CSV and its
signature, and recording an acknowledgement."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.drop.calendar import drop_day_bounds, drop_moment
from integrations.evidence import pack
from integrations.evidence.directives import directive_verify
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    Directive,
    DirectiveReason,
    LedgerEvent,
    ServiceProvider,
    WorkItem,
)
from integrations.selectors.directives import directive_ack_due_date, directives_overdue
from integrations.services.providers.directives import directives_issue
from tests.builders import DropCycleFactory, WorkItemFactory

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def directive(broker: Broker) -> Directive:
    """Mailhouse, registered by the command, directed to delete two matched work items."""
    run("providers", "add", "--broker", "4821", "--name", "Mailhouse", "--contact", "ops@m.example")
    cycle = DropCycleFactory.create(broker=broker)
    items = [
        WorkItemFactory.create(cycle=cycle, list_type=list_type) for list_type in ("Email", "Phone")
    ]
    (issued,) = directives_issue(
        broker=broker, work_items=[w.pk for w in items], reason=DirectiveReason.MATCH
    )
    return issued


def test_add_then_list(broker: Broker) -> None:
    said = run(
        "providers", "add", "--broker", "4821", "--name", "Warehouse", "--s3", "s3://wh/drop/"
    )
    assert "Warehouse" in said and "s3://wh/drop/" in said
    listed = json.loads(run("providers", "list", "--json"))["items"]
    assert [(p["name"], p["broker_id"], p["s3_prefix"]) for p in listed] == [
        ("Warehouse", "4821", "s3://wh/drop/")
    ]
    assert LedgerEvent.objects.filter(kind=LedgerKind.SERVICE_PROVIDER_ADDED).count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--s3", "s3://bucket-without-slash"], "ending in a slash"),
        (["--s3", "https://bucket/"], "use s3://bucket/prefix/"),
        (["--contact", "not-an-email"], "not an email address"),
        # Longer than their columns hold (an email address may be longer than 254).
        (["--s3", f"s3://bucket/{'p' * 500}/"], "at most 500 characters"),
        (["--contact", f"ops@{'mail.' * 60}example"], "at most 254 characters"),
    ],
)
def test_add_refuses_what_it_cannot_use_in_one_line(
    broker: Broker, args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run("providers", "add", "--broker", "4821", "--name", "Warehouse", *args)
    assert not LedgerEvent.objects.filter(kind=LedgerKind.SERVICE_PROVIDER_ADDED).exists()


@pytest.mark.parametrize(
    "s3", ["s3://AKIAEXAMPLE7Q:wJalrXUtnSECRET9@wh/drop/", "s3://AKIAEXAMPLE7Q@wh/drop/"]
)
def test_an_s3_prefix_holding_credentials_is_refused_and_not_echoed(
    broker: Broker, s3: str
) -> None:
    # The prefix is kept in clear, listed, and shown to every role that sees providers.
    with pytest.raises(CommandError, match="not a bucket name") as refused:
        run("providers", "add", "--broker", "4821", "--name", "Warehouse", "--s3", s3)
    assert "AKIAEXAMPLE7Q" not in str(refused.value)
    assert not ServiceProvider.objects.exists()
    assert not LedgerEvent.objects.filter(kind=LedgerKind.SERVICE_PROVIDER_ADDED).exists()


def test_a_second_provider_of_the_same_name_is_refused(broker: Broker) -> None:
    run("providers", "add", "--broker", "4821", "--name", "Warehouse")
    with pytest.raises(CommandError, match="already has a provider named 'Warehouse'"):
        run("providers", "add", "--broker", "4821", "--name", "Warehouse")


def test_drop_directives_lists_each_with_its_acknowledgement(directive: Directive) -> None:
    text = run("drop", "directives", "--broker", "4821")
    assert f"{directive.pk}" in text and "Mailhouse" in text
    assert "2 hashes" in text and "awaiting acknowledgement" in text
    run("providers", "acknowledge", str(directive.pk), "--reference", "ticket 4410")
    (listed,) = json.loads(run("drop", "directives", "--broker", "4821", "--json"))["items"]
    assert listed["id"] == directive.pk
    assert listed["rows_by_hash_type"] == {"email": 1, "phone": 1}
    assert listed["acknowledgement_reference"] == "ticket 4410"
    assert listed["acknowledged_by"].startswith("cli")
    with pytest.raises(CommandError, match="already acknowledged"):
        run("providers", "acknowledge", str(directive.pk), "--reference", "again")


def test_a_reference_is_printed_with_its_control_characters_escaped(
    directive: Directive,
) -> None:
    # One stored before the API refused them: it must not retitle or clear the terminal.
    Directive.objects.filter(pk=directive.pk).update(
        acknowledged_at=dt.datetime(2026, 7, 4, tzinfo=dt.UTC),
        acknowledged_by="apikey:dpk_x",
        acknowledgement_reference="ok\x1b]0;pwned\x07\x1b[2J\x9b",
    )
    listed = run("drop", "directives", "--broker", "4821")
    assert "(ok\\x1b]0;pwned\\x07\\x1b[2J\\x9b)" in listed
    with pytest.raises(CommandError) as refused:
        run("providers", "acknowledge", str(directive.pk), "--reference", "again")
    for printed in (listed, str(refused.value)):
        assert not any(c in printed for c in "\x1b\x07\x9b")


def test_a_reference_with_control_characters_is_refused(directive: Directive) -> None:
    with pytest.raises(CommandError, match="reference must not hold control characters"):
        run("providers", "acknowledge", str(directive.pk), "--reference", "ticket\t4410")
    directive.refresh_from_db()
    assert directive.acknowledged_at is None


# 03:00 UTC on July 2 is still July 1 in California, the calendar staff count days in.
LATE_EVENING = dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC)


def test_directive_dates_are_days_of_drops_calendar(directive: Directive) -> None:
    Directive.objects.filter(pk=directive.pk).update(created_at=LATE_EVENING)
    listed = run("drop", "directives", "--broker", "4821")
    assert f"{directive.pk:>6}  2026-07-01  Mailhouse  " in listed
    assert listed.rstrip().endswith("NOT acknowledged, due 2026-07-11")  # ten days on
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit):
        call_command("drop", "doctor", stdout=out, stderr=err)
    assert "not acknowledged, due 2026-07-11: record it" in err.getvalue()

    run("providers", "acknowledge", str(directive.pk), "--reference", "ticket 4410")
    Directive.objects.filter(pk=directive.pk).update(
        acknowledged_at=LATE_EVENING + dt.timedelta(days=3)
    )
    assert "acknowledged 2026-07-04 by cli" in run("drop", "directives", "--broker", "4821")
    with pytest.raises(CommandError, match="already acknowledged on 2026-07-04 by cli"):
        run("providers", "acknowledge", str(directive.pk), "--reference", "again")


@pytest.mark.parametrize(
    ("issued", "due"),
    [
        # 23:30 PST, a week before the clocks go forward: ten times 24 hours end at 00:30
        # PDT on March 12, but the tenth day after March 1 is March 11.
        ("2026-03-01 23:30", dt.date(2026, 3, 11)),
        # The clocks go back on November 1: ten times 24 hours end at 23:30 on November 3.
        ("2026-10-25 00:30", dt.date(2026, 11, 4)),
    ],
)
def test_a_directive_is_due_ten_days_of_drops_calendar_after_the_day_it_was_issued(
    directive: Directive, issued: str, due: dt.date
) -> None:
    created_at = drop_moment(issued)
    Directive.objects.filter(pk=directive.pk).update(created_at=created_at)
    directive.refresh_from_db()
    overdue_from = drop_day_bounds(due)[1]

    assert directive_ack_due_date(directive) == due
    assert not directives_overdue(now=overdue_from - dt.timedelta(microseconds=1))
    assert list(directives_overdue(now=overdue_from)) == [directive]
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit):
        call_command("drop", "doctor", stdout=out, stderr=err)
    assert f"not acknowledged, due {due}: record it" in err.getvalue()


def test_drop_directive_writes_the_csv_and_a_signature_that_verifies(
    directive: Directive, tmp_path: Path
) -> None:
    out = tmp_path / "directive.csv"
    said = run("drop", "directive", str(directive.pk), "--out", str(out))
    assert directive.sha256 in said
    content = out.read_bytes()
    hashes = sorted(
        f"{w.hash_type},{base64.b64encode(bytes(w.hash)).decode()}" for w in WorkItem.objects.all()
    )
    assert content.decode().splitlines() == ["hash_type,hash", *hashes]
    public_key = pack.load_public_key(run("evidence", "public-key"))
    directive_verify(public_key, content, (tmp_path / "directive.csv.sig").read_bytes())
    assert LedgerEvent.objects.get(kind=LedgerKind.DIRECTIVE_DOWNLOADED).data["via"] == "command"


def test_a_signature_that_cannot_be_written_leaves_the_directive_file_as_it_was(
    directive: Directive, tmp_path: Path
) -> None:
    out = tmp_path / "directive.csv"
    out.write_text("an earlier download\n")
    (tmp_path / "directive.csv.sig").mkdir()  # the signature's path is taken

    with pytest.raises(CommandError, match=r"cannot write .*directive\.csv\.sig: Is a directory"):
        run("drop", "directive", str(directive.pk), "--out", str(out))

    assert out.read_text() == "an earlier download\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["directive.csv", "directive.csv.sig"]
    assert not LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DOWNLOADED).exists()


def test_a_directive_file_that_cannot_be_written_leaves_no_signature_behind(
    directive: Directive, tmp_path: Path
) -> None:
    out = tmp_path / "directive.csv"
    out.mkdir()  # the file's path is taken

    with pytest.raises(CommandError, match=r"--out .*directive\.csv is a folder"):
        run("drop", "directive", str(directive.pk), "--out", str(out))

    assert sorted(p.name for p in tmp_path.iterdir()) == ["directive.csv"]  # no lone .sig
    assert not LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DOWNLOADED).exists()


def test_an_empty_out_is_refused_in_words_that_say_so(
    directive: Directive, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    with pytest.raises(CommandError, match=r"^--out is empty: give the path of the file"):
        run("drop", "directive", str(directive.pk), "--out", "")

    assert list(tmp_path.iterdir()) == []
    assert not LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DOWNLOADED).exists()


def test_a_signature_that_cannot_be_written_takes_back_a_new_directive_file(
    directive: Directive, tmp_path: Path
) -> None:
    out = tmp_path / "directive.csv"
    (tmp_path / "directive.csv.sig").mkdir()  # the CSV is put in place first, then taken back

    with pytest.raises(CommandError, match=r"cannot write .*directive\.csv\.sig: Is a directory"):
        run("drop", "directive", str(directive.pk), "--out", str(out))

    assert sorted(p.name for p in tmp_path.iterdir()) == ["directive.csv.sig"]
    assert not out.exists()


def test_an_unknown_directive_is_one_line(broker: Broker, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no directive 999"):
        run("drop", "directive", "999", "--out", str(tmp_path / "x.csv"))
    with pytest.raises(CommandError, match="no directive 999"):
        run("providers", "acknowledge", "999", "--reference", "x")


def test_drop_doctor_lists_a_directive_not_acknowledged_in_time(
    directive: Directive,
) -> None:
    Directive.objects.filter(pk=directive.pk).update(
        created_at=directive.created_at - dt.timedelta(days=11)
    )
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("drop", "doctor", stdout=out, stderr=err)
    assert exited.value.code == 1
    assert f"directive {directive.pk} to Mailhouse" in err.getvalue()
    assert f"providers acknowledge {directive.pk}" in err.getvalue()
