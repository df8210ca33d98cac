"""``GET /api/v1/drop/outcomes``: paginated JSON or streamed CSV, the key's broker only."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from integrations.models import Broker, DeletionRequest, LedgerEvent
from integrations.selectors.outcomes import OUTCOME_COLUMNS
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import CreatedApiKey
from tests.builders import OutcomeHistory, outcome_history
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

URL = "/api/v1/drop/outcomes"


@pytest.fixture
def history(broker: Broker) -> OutcomeHistory:
    other = broker_create(broker_id="1234", name="Other", mode="test", actor="test")
    return outcome_history(broker, other)


@pytest.fixture
def auditor(api_client: APIClient, make_key: Callable[..., CreatedApiKey]) -> APIClient:
    api_client.credentials(**bearer(make_key("audit").key))
    return api_client


def test_pages_hold_the_keys_broker_only_in_request_order(
    history: OutcomeHistory, auditor: APIClient
) -> None:
    first = auditor.get(URL, {"limit": 2})

    assert first.status_code == 200
    body = first.json()
    assert [r["request_uuid"] for r in body["results"]] == [
        str(history.deleted.request_uuid),
        str(history.failed.request_uuid),
    ]
    assert list(body["results"][0]) == list(OUTCOME_COLUMNS)
    assert body["results"][0]["report_file"] == "20260312_4821_Email.csv"
    assert body["next"].startswith("http://testserver/api/v1/drop/outcomes?")

    second = auditor.get(body["next"]).json()

    assert [r["request_uuid"] for r in second["results"]] == [str(history.amended.request_uuid)]
    assert second["results"][0]["amended"] is True
    assert (second["next"], second["next_cursor"]) == (None, None)


def test_date_filters(history: OutcomeHistory, auditor: APIClient) -> None:
    body = auditor.get(URL, {"since": "2026-03-13", "until": "2026-03-31"}).json()
    assert [r["request_uuid"] for r in body["results"]] == [str(history.failed.request_uuid)]


def test_dates_are_days_of_drops_calendar(history: OutcomeHistory, auditor: APIClient) -> None:
    # 03:00 UTC on July 2 is still July 1 in California, the day DROP counts it in, and the
    # day `outcomes export --since 2026-07-01 --until 2026-07-01` and the evidence packs put
    # it in: the same dates give the same rows here.
    late = dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC)
    DeletionRequest.objects.filter(pk=history.deleted.pk).update(matched_at=late)

    def matched(**dates: str) -> list[str]:
        return [r["request_uuid"] for r in auditor.get(URL, dates).json()["results"]]

    assert matched(since="2026-07-01", until="2026-07-01") == [str(history.deleted.request_uuid)]
    assert matched(since="2026-07-02") == []
    # A time with its offset is that moment, whatever the zone.
    assert matched(since="2026-07-02T03:00:00Z", until="2026-07-02T03:00:01Z") == [
        str(history.deleted.request_uuid)
    ]
    # RFC 3339 lets the T and the Z be written in lowercase (its section 5.6).
    assert matched(since="2026-07-02t03:00:00z", until="2026-07-02t03:00:01z") == [
        str(history.deleted.request_uuid)
    ]


def test_a_brokers_pages_are_read_through_its_index(
    history: OutcomeHistory, auditor: APIClient
) -> None:
    # Through the primary key a page read past every other broker's requests on the way. With
    # sorts and sequential scans ruled out, only an index on the broker and id answers the
    # page in order; the plan PostgreSQL picks with its costs is in migration 0065's commit.
    with CaptureQueriesContext(connection) as queries:
        assert auditor.get(URL, {"limit": 1}).status_code == 200
    (page,) = [q["sql"] for q in queries if 'FROM "integrations_deletionrequest"' in q["sql"]]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {page}")
        plan = cursor.fetchone()[0][0]["Plan"]

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    requests = [n for n in nodes(plan) if n.get("Relation Name") == "integrations_deletionrequest"]
    assert [n.get("Index Name") for n in requests] == ["deletion_request_broker_pages"], plan


def test_csv_streams_the_whole_filtered_history(
    history: OutcomeHistory, auditor: APIClient
) -> None:
    response = auditor.get(URL, {"limit": 1}, HTTP_ACCEPT="text/csv")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert 'filename="outcomes-4821.csv"' in response["Content-Disposition"]
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["request_uuid"] for r in rows] == [
        str(history.deleted.request_uuid),
        str(history.failed.request_uuid),
        str(history.amended.request_uuid),
    ]
    assert rows[1]["error_message"].startswith("'=HYPERLINK")
    event = LedgerEvent.objects.get(kind="outcomes.exported")
    assert (event.subject, event.broker_id, event.actor[:7]) == ("api", "4821", "apikey:")


def test_another_brokers_outcomes_are_refused(history: OutcomeHistory, auditor: APIClient) -> None:
    own = auditor.get(URL, {"broker": "4821"})
    other = auditor.get(URL, {"broker": "1234"}, HTTP_ACCEPT="text/csv")

    assert own.status_code == 200
    assert other.status_code == 403
    assert other["Content-Type"] == "application/problem+json"
    assert other.json()["code"] == "broker_forbidden"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "last week"}, "since"),
        ({"until": "2026-13-01"}, "until"),
        ({"until": "9999-12-31"}, "until"),  # the day after it is past Python's dates
        ({"since": "0001-01-01T00:00:00+23:59"}, "since"),
        ({"since": "2026-03-13", "until": "2026-03-12"}, "until"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"cursor": "not-ours"}, "cursor"),
        ({"cursor": "8000000000000000"}, "cursor"),  # past PostgreSQL's bigint
        ({"since": ""}, "since"),  # empty is not absent: the schema does not allow it
        ({"until": "2026-03-13T10:00"}, "until"),  # an RFC 3339 time has seconds and offset
        ({"broker": "48"}, "broker"),
        # A misspelt filter ignored handed back the whole history as if filtered.
        ({"sinse": "2026-03-13"}, "sinse"),
        ({"since": ["2026-03-12", "2026-03-13"]}, "since"),  # twice: which one is meant?
    ],
)
def test_bad_parameters_are_validation_problems(
    history: OutcomeHistory, auditor: APIClient, params: dict[str, Any], field: str
) -> None:
    response = auditor.get(URL, params)
    assert response.status_code == 400
    assert response.json()["code"] == "validation_failed"
    assert field in response.json()["errors"]


def test_a_time_with_any_offset_python_takes_is_accepted(
    history: OutcomeHistory, auditor: APIClient
) -> None:
    # PostgreSQL refuses offsets past 15:59 itself: the view hands it UTC.
    response = auditor.get(URL, {"since": "2026-01-01T00:00:00-23:59"})
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("day", ["1000-01-01", "9989-12-31", "9990-01-01", "9998-12-31"])
def test_every_year_the_schema_names_is_taken(
    history: OutcomeHistory, auditor: APIClient, day: str
) -> None:
    # Years 1000 to 9998, as the field's error and the schema say, for either bound.
    for bound in ("since", "until"):
        response = auditor.get(URL, {bound: day})
        assert response.status_code == 200, (bound, response.content)


def test_an_unknown_format_is_a_problem(history: OutcomeHistory, auditor: APIClient) -> None:
    response = auditor.get(URL, {"format": "xml"})
    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "not_found"


def test_the_audit_scope_is_required(
    history: OutcomeHistory, api_client: APIClient, make_key: Callable[..., CreatedApiKey]
) -> None:
    api_client.credentials(**bearer(make_key("ingest").key))
    assert api_client.get(URL).json()["code"] == "scope_missing"
    api_client.credentials()
    assert api_client.get(URL, HTTP_ACCEPT="text/csv").status_code == 401


def test_an_unsupported_media_type_gets_json(history: OutcomeHistory, auditor: APIClient) -> None:
    response = auditor.get(URL, HTTP_ACCEPT="application/xml")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert len(response.json()["results"]) == len(auditor.get(URL).json()["results"])


def test_the_format_parameter_wins_over_the_accept_header(
    history: OutcomeHistory, auditor: APIClient
) -> None:
    response = auditor.get(URL, {"format": "csv"}, HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"


def test_the_endpoint_is_in_the_schema(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", HTTP_ACCEPT="application/json").json()
    get = schema["paths"]["/api/v1/drop/outcomes"]["get"]
    assert set(get["responses"]["200"]["content"]) == {"application/json", "text/csv"}
    assert {p["name"] for p in get["parameters"]} >= {"broker", "since", "until", "cursor", "limit"}
    # The schema's patterns take what the view takes: a client that checks its values against
    # them is not refused a time the view would answer.
    since = next(p for p in get["parameters"] if p["name"] == "since")["schema"]
    date_time = next(s for s in since["anyOf"] if s["format"] == "date-time")
    assert re.fullmatch(date_time["pattern"][1:-1], "2026-07-02t03:00:00.5z")


@pytest.mark.parametrize("accept", ["application/json", "text/csv"])
def test_an_outcome_answer_is_stored_by_no_cache(
    history: OutcomeHistory, auditor: APIClient, accept: str
) -> None:
    # Pointers and hashes: a browser's or a client library's cache keeps nothing of them.
    answer = auditor.get(URL, HTTP_ACCEPT=accept)

    assert answer.status_code == 200
    assert "no-store" in answer["Cache-Control"]
    # Refusals too.
    assert "no-store" in APIClient().get(URL)["Cache-Control"]


def test_head_on_the_csv_neither_runs_nor_ledgers_the_export(
    history: OutcomeHistory, auditor: APIClient
) -> None:
    answer = auditor.head(URL, HTTP_ACCEPT="text/csv")

    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/csv")
    assert "Content-Length" not in answer  # streamed, as the GET is: not "0"
    assert not LedgerEvent.objects.filter(kind="outcomes.exported").exists()
