"""``outcomes export``: one row per deletion request with its whole history."""

from __future__ import annotations

import csv
import datetime as dt
import importlib
import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from integrations.models import Broker, DeletionRequest, LedgerEvent
from integrations.selectors.outcomes import OUTCOME_COLUMNS, deletion_outcomes_csv
from integrations.services.dispatch.redelivery import deletion_request_redispatch
from integrations.services.staff.brokers import broker_create
from tests.builders import DeliveryAttemptFactory, OutcomeHistory, at, outcome_history

pytestmark = pytest.mark.django_db

PRODUCT_COLUMNS = (  # docs/contracts.md §13
    "request_uuid",
    "broker_id",
    "drop_session_id",
    "work_item_id",
    "hash_type",
    "identifier_hash",
    "remote_identifier",
    "integration_id",
    "state",
    "drop_outcome",
    "drop_status_code",
    "error_message",
    "matched_at",
    "dispatched_at",
    "completed_at",
    "reported_at",
    "report_file",
    "late_match",
)


@pytest.fixture
def history(broker: Broker) -> OutcomeHistory:
    other = broker_create(broker_id="1234", name="Other", mode="test", actor="test")
    return outcome_history(broker, other)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("outcomes", "export", *args, stdout=out)
    return out.getvalue()


def test_csv_has_every_request_with_the_columns_auditors_need(history: OutcomeHistory) -> None:
    rows = list(csv.DictReader(io.StringIO(run())))

    assert set(PRODUCT_COLUMNS) <= set(rows[0])
    assert [r["request_uuid"] for r in rows] == [
        str(history.deleted.request_uuid),
        str(history.failed.request_uuid),
        str(history.amended.request_uuid),
        str(history.other_broker.request_uuid),
    ]
    deleted = rows[0]
    assert deleted["broker_id"] == "4821"
    assert deleted["work_item_id"] == "A1b2C3d4E5f6"
    assert deleted["list_type"] == "Email"
    integration = history.deleted.integration
    assert integration is not None
    assert deleted["integration_id"] == str(integration.uuid)
    assert (deleted["state"], deleted["drop_outcome"], deleted["drop_status_code"]) == (
        "completed",
        "deleted",
        "3",
    )
    assert deleted["dispatched_at"] == "2026-03-12T10:00:05+00:00"  # the first attempt
    assert deleted["acknowledged_at"] == "2026-03-12T10:05:00+00:00"  # the 2xx
    assert deleted["completed_at"] == "2026-03-13T08:00:00+00:00"
    assert deleted["report_file"] == "20260312_4821_Email.csv"
    assert deleted["reported_status_code"] == "3"
    assert deleted["reported_at"] != ""
    assert (deleted["amended"], deleted["late_match"]) == ("false", "false")
    amended = rows[2]
    assert amended["report_file"] == "20260312_4821_Email_amend01.csv"
    assert (amended["amended"], amended["late_match"]) == ("true", "true")


def test_a_request_sent_again_was_dispatched_at_its_first_send(history: OutcomeHistory) -> None:
    """A redispatch starts the attempts count afresh: acknowledged at its new first attempt,
    the request was still first sent long before."""
    failed = history.failed
    DeliveryAttemptFactory.create(
        deletion_request=failed, number=1, started_at=at("2026-03-13T10:00:01"), status=200
    )
    deletion_request_redispatch(deletion_request=failed, actor="staff:ann")
    DeliveryAttemptFactory.create(
        deletion_request=failed, number=1, started_at=at("2026-03-20T09:00:00"), status=200
    )
    DeletionRequest.objects.filter(pk=failed.pk).update(
        state="dispatched", attempts=1, dispatched_at=at("2026-03-20T09:00:00")
    )

    row = list(csv.DictReader(io.StringIO(run())))[1]

    assert row["request_uuid"] == str(failed.request_uuid)
    assert row["dispatched_at"] == "2026-03-13T10:00:01+00:00"  # not the redispatch's
    assert row["acknowledged_at"] == "2026-03-20T09:00:00+00:00"


def test_the_requests_sent_again_before_the_mark_existed_are_marked_from_the_ledger(
    history: OutcomeHistory,
) -> None:
    deletion_request_redispatch(deletion_request=history.failed, actor="staff:ann")
    DeletionRequest.objects.update(requeued=False)  # as the column's default left them
    migration = importlib.import_module("integrations.migrations.0063_deletion_request_requeued")

    with connection.cursor() as cursor:
        cursor.execute(migration.MARK_REQUEUED)

    assert list(DeletionRequest.objects.filter(requeued=True)) == [history.failed]


def test_the_csv_streams_whole_past_a_web_request_s_statement_bound(
    history: OutcomeHistory,
) -> None:
    """The web bounds each statement; the export's one COPY streams after the 200 went out,
    and PostgreSQL cancelling it there left a truncated file."""
    slow = DeletionRequest.objects.extra(where=["pg_sleep(0.05) IS NOT NULL"])
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '100ms'")  # as a web request's connection
    try:
        body = b"".join(deletion_outcomes_csv(requests=slow))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")

    assert len(body.decode().splitlines()) == 1 + DeletionRequest.objects.count()


def test_csv_cells_cannot_run_as_formulas(history: OutcomeHistory) -> None:
    type(history.failed).objects.filter(pk=history.failed.pk).update(remote_identifier_kind="-2+3")
    failed = list(csv.DictReader(io.StringIO(run())))[1]
    assert failed["remote_identifier_kind"] == "'-2+3"
    assert failed["error_message"] == '\'=HYPERLINK("http://evil.example")'
    # The broker's pointer is its free text, defused too (the JSONL export keeps it exact).
    assert failed["remote_identifier"] == "'@crm:user-7"
    assert (failed["state"], failed["drop_status_code"], failed["report_file"]) == (
        "failed",
        "",
        "",
    )


def test_csv_keeps_hashes_exact_even_when_they_start_like_a_formula(
    history: OutcomeHistory,
) -> None:
    plus_hash = "+" + history.deleted.identifier_hash[1:]
    type(history.deleted).objects.filter(pk=history.deleted.pk).update(identifier_hash=plus_hash)

    deleted = next(iter(csv.DictReader(io.StringIO(run()))))

    assert deleted["identifier_hash"] == plus_hash  # what DROP sent, to compare with its files
    assert deleted["request_uuid"] == str(history.deleted.request_uuid)


def test_jsonl_keeps_values_exact_and_filters_by_broker_and_dates(
    history: OutcomeHistory,
) -> None:
    lines = run("--format", "jsonl", "--broker", "4821", "--since", "2026-03-13")
    rows = [json.loads(line) for line in lines.splitlines()]

    assert [r["request_uuid"] for r in rows] == [
        str(history.failed.request_uuid),
        str(history.amended.request_uuid),
    ]
    assert list(rows[0]) == list(OUTCOME_COLUMNS)
    assert rows[0]["remote_identifier"] == "@crm:user-7"
    assert rows[0]["error_message"] == '=HYPERLINK("http://evil.example")'
    assert rows[0]["drop_status_code"] is None
    assert rows[1]["late_match"] is True

    until = run("--format", "jsonl", "--broker", "4821", "--until", "2026-03-13")
    assert len(until.splitlines()) == 2  # the 12th and the 13th, whole days


def test_dates_are_days_of_drops_calendar(history: OutcomeHistory) -> None:
    # 03:00 UTC on July 2 is still July 1 in California, the day DROP counts it in.
    late = dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC)
    DeletionRequest.objects.filter(pk=history.deleted.pk).update(matched_at=late)

    def matched(*dates: str) -> list[str]:
        lines = run("--format", "jsonl", "--broker", "4821", *dates).splitlines()
        return [json.loads(line)["request_uuid"] for line in lines]

    assert matched("--since", "2026-07-01", "--until", "2026-07-01") == [
        str(history.deleted.request_uuid)
    ]
    assert matched("--since", "2026-07-02") == []
    # A date in ISO's basic form is the same day, the whole of it.
    assert matched("--since", "20260701", "--until", "20260701") == [
        str(history.deleted.request_uuid)
    ]
    # RFC 3339 allows a lowercase t and z, as the API reads them.
    assert matched("--since", "2026-07-02t02:59:59z", "--until", "2026-07-02t03:00:01z") == [
        str(history.deleted.request_uuid)
    ]


def test_out_file_is_written_whole(history: OutcomeHistory, tmp_path: Path) -> None:
    target = tmp_path / "outcomes.csv"
    err = io.StringIO()
    call_command("outcomes", "export", "--out", str(target), stdout=io.StringIO(), stderr=err)
    assert target.read_text().startswith(",".join(OUTCOME_COLUMNS[:3]))
    assert f"Wrote the outcome history to {target}" in err.getvalue()
    event = LedgerEvent.objects.get(kind="outcomes.exported")
    assert (event.subject, event.data["filters"]["out"]) == ("command", str(target))
    assert len(target.read_text().splitlines()) == 5  # the header and four requests
    assert [p.name for p in tmp_path.iterdir()] == ["outcomes.csv"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--broker", "9999"], "no broker with id '9999'"),
        (["--since", "March"], "not a date: 'March'"),
        (["--since", "2026-03-13", "--until", "2026-03-12"], "--until must be after --since"),
        (["--format", "xlsx"], "invalid choice: 'xlsx'"),
    ],
)
def test_bad_arguments_are_one_clear_error(
    history: OutcomeHistory, tmp_path: Path, args: list[str], message: str
) -> None:
    target = tmp_path / "outcomes.csv"
    with pytest.raises(CommandError, match=message):
        call_command("outcomes", "export", *args, "--out", str(target))
    assert not target.exists()
