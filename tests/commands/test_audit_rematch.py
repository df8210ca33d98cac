"""``audit rematch``: a cycle's DROP hashes matched again against the consumers registered
now; every difference with what the service recorded is explained by its ledger event, or
named, and the command exits 1.

The cycle is imported through the service: six work items, two matched at the import
(consumers C-0 and C-1); each test then changes the consumers one way, through the
services (explained) or behind their back (unexplained).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from devtools.drop_simulator import work_items
from integrations.models import Broker, Consumer, DeletionRequest, DropCycle, LedgerEvent
from integrations.services.cycle.consumers import consumer_forget
from integrations.services.cycle.drop_import import drop_zip_import
from tests.builders import ConsumerFactory, WebhookIntegrationFactory, drop_zip, write_zip

pytestmark = pytest.mark.django_db
ITEMS = list(work_items(6))


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path) -> DropCycle:
    WebhookIntegrationFactory.create(broker=broker)
    for n in range(2):
        ConsumerFactory.create(
            broker=broker, remote_identifier=f"C-{n}", hashes={"email": ITEMS[n][1]}
        )
    package = drop_zip(broker, {"Email": ITEMS[:4], "Phone": ITEMS[4:]})
    return drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test").cycle


def rematch(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("audit", "rematch", "--broker", "4821", *args, stdout=out)
    except SystemExit as exited:
        return int(exited.code or 0), out.getvalue()
    return 0, out.getvalue()


def rematch_json(cycle: DropCycle) -> tuple[int, dict[str, Any]]:
    code, out = rematch("--cycle", cycle.drop_session_id, "--json")
    return code, json.loads(out)


def register(tmp_path: Path, rows: str) -> None:
    """Consumers registered through the service (``consumers import``): matched at once."""
    path = tmp_path / "consumers.csv"
    path.write_text("remote_identifier,hash_type,hash\n" + rows)
    call_command(
        "consumers", "import", "--broker", "4821", "--hashed", str(path), stdout=io.StringIO()
    )


def hash_inserted_behind_the_service(broker: Broker, remote_identifier: str, hash_: str) -> None:
    """A consumer and its hash written straight into the tables: no registration, no
    ledger event, no matching."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO integrations_consumer (broker_id, remote_identifier,"
            " remote_identifier_kind) VALUES (%s, %s, 'external_id') RETURNING id",
            [broker.pk, remote_identifier],
        )
        (consumer_id,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO integrations_consumerhash (broker_id, consumer_id, hash_type, hash)"
            " VALUES (%s, %s, 'email', %s)",
            [broker.pk, consumer_id, base64.b64decode(hash_)],
        )


def test_a_cycle_as_recorded_passes(cycle: DropCycle) -> None:
    code, out = rematch("--cycle", cycle.drop_session_id)

    assert code == 0
    assert "Matched at the import: 2 work items (2 with deletion requests)" in out
    assert "matching now: 2 (2 consumer matches, 2 recorded)" in out
    assert out.strip().endswith("PASS: the same matches as recorded, no difference.")


def test_a_consumer_hash_inserted_behind_the_services_back_fails_and_is_named(
    broker: Broker, cycle: DropCycle
) -> None:
    hash_inserted_behind_the_service(broker, "X-1", ITEMS[3][1])

    code, out = rematch("--cycle", cycle.drop_session_id)

    assert code == 1
    assert f"UNEXPLAINED match_not_recorded: work item {ITEMS[3][0]} (email), consumer X-1" in out
    assert "FAIL: 1 difference(s) no ledger event explains, 0 explained." in out
    code, report = rematch_json(cycle)
    assert code == 1 and report["summary"]["unexplained"] == {"match_not_recorded": 1}
    (difference,) = report["differences"]
    assert difference["work_item_id"] == ITEMS[3][0] and difference["event"] is None


def test_a_consumer_forgotten_since_is_explained_by_its_event(
    broker: Broker, cycle: DropCycle
) -> None:
    consumer_forget(broker=broker, remote_identifier="C-0", actor="test")
    event = LedgerEvent.objects.get(kind="consumer.forgotten")

    code, report = rematch_json(cycle)

    assert code == 0
    assert report["summary"]["explained"] == {"consumer_forgotten": 1}
    assert report["summary"]["matched_now"] == 1 and report["summary"]["matched_recorded"] == 2
    (difference,) = report["differences"]
    assert (difference["work_item_id"], difference["remote_identifier"]) == (ITEMS[0][0], "C-0")
    assert difference["consumer_id"] is None
    assert difference["event"]["kind"] == "consumer.forgotten"
    assert difference["event"]["id"] == event.pk


def test_a_match_recorded_with_no_consumer_and_no_event_fails(
    broker: Broker, cycle: DropCycle
) -> None:
    # The consumer deleted behind the service's back: its requests lose it, no event.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE integrations_deletionrequest SET consumer_id = NULL"
            " WHERE remote_identifier = 'C-1'"
        )
    Consumer.objects.filter(remote_identifier="C-1").delete()

    code, out = rematch("--cycle", cycle.drop_session_id)

    assert code == 1
    assert f"UNEXPLAINED consumer_missing: work item {ITEMS[1][0]} (email), consumer C-1" in out


def test_a_late_match_is_explained_and_says_whether_it_was_dispatched(
    cycle: DropCycle, tmp_path: Path
) -> None:
    register(tmp_path, f"L-1,email,{ITEMS[2][1]}\n")
    event = LedgerEvent.objects.get(kind="drop.late_matched")

    code, out = rematch("--cycle", cycle.drop_session_id)

    assert code == 0
    assert f"explained late_match: work item {ITEMS[2][0]} (email), consumer L-1 (row " in out
    assert f"[drop.late_matched #{event.pk}, " in out and "; not dispatched yet" in out
    assert "1 late_match: matched after the import by a consumer registered later" in out

    DeletionRequest.objects.filter(late_match=True).update(
        state="dispatched", dispatched_at=timezone.now()
    )
    code, report = rematch_json(cycle)
    (difference,) = report["differences"]
    assert code == 0 and difference["dispatched"] is True
    assert report["summary"]["matched_now"] == 3
    assert report["summary"]["matched_recorded_at_import"] == 2


def test_json_streams_the_differences_then_the_summary(
    broker: Broker, cycle: DropCycle, tmp_path: Path
) -> None:
    register(tmp_path, f"L-1,email,{ITEMS[2][1]}\n")
    hash_inserted_behind_the_service(broker, "X-1", ITEMS[3][1])

    code, report = rematch_json(cycle)

    assert code == 1
    assert list(report) == ["broker_id", "cycle", "differences", "summary"]
    assert (report["broker_id"], report["cycle"]) == ("4821", cycle.drop_session_id)
    # Unexplained ones first.
    assert [(d["reason"], d["explained"]) for d in report["differences"]] == [
        ("match_not_recorded", False),
        ("late_match", True),
    ]
    assert set(report["differences"][1]) == {
        "reason", "explained", "work_item_id", "hash_type", "consumer_id",
        "remote_identifier", "matched_at", "dispatched", "event",
    }  # fmt: skip
    assert report["summary"] == {
        "broker_id": "4821",
        "cycle": cycle.drop_session_id,
        "work_items": 6,
        "matched_at_import": 2,
        "matched_recorded_at_import": 2,
        "matched_recorded": 3,
        "matched_now": 4,
        "pairs_recorded": 3,
        "pairs_now": 4,
        "explained": {"late_match": 1},
        "unexplained": {"match_not_recorded": 1},
        "result": "fail",
    }


def test_an_unknown_broker_or_cycle_is_one_clear_error(cycle: DropCycle) -> None:
    with pytest.raises(CommandError, match="no broker with id '9999'"):
        call_command("audit", "rematch", "--broker", "9999", "--cycle", "1")
    with pytest.raises(CommandError, match="broker 4821 has no cycle '77'"):
        call_command("audit", "rematch", "--broker", "4821", "--cycle", "77")


def test_a_work_item_removed_before_its_consumer_came_is_explained(
    broker: Broker, cycle: DropCycle, tmp_path: Path
) -> None:
    later = drop_zip(
        broker, {"Email": []}, removed=[(ITEMS[3][0], ITEMS[3][1], "Email")], date="20261201"
    )
    drop_zip_import(
        broker=broker, path=write_zip(tmp_path, later, "20261201_4821_DROP.zip"), actor="test"
    )
    register(tmp_path, f"L-1,email,{ITEMS[3][1]}\n")  # no request: DROP removed the item

    code, out = rematch("--cycle", cycle.drop_session_id)

    assert code == 0, out
    event = LedgerEvent.objects.get(kind="drop.work_items_removed")
    assert f"explained work_item_removed: work item {ITEMS[3][0]} (email), consumer L-1" in out
    assert f"[drop.work_items_removed #{event.pk}, " in out


def replaced_by(tmp_path: Path, rows: str) -> None:
    """The broker's whole set replaced by these hashed ``rows``, whatever it forgets."""
    path = tmp_path / "full-set.csv"
    path.write_text(f"remote_identifier,hash_type,hash\n{rows}")
    call_command(
        "consumers", "import", "--broker", "4821", "--hashed", "--replace", "--force", str(path),
        stdout=io.StringIO(),
    )  # fmt: skip


def test_consumers_forgotten_by_a_full_replacement_are_explained_by_it(
    cycle: DropCycle, tmp_path: Path
) -> None:
    replaced_by(tmp_path, f"N-1,phone,{ITEMS[5][1]}\n")
    event = LedgerEvent.objects.get(kind="consumers.replaced")

    code, report = rematch_json(cycle)

    assert code == 0
    assert report["summary"]["explained"] == {"consumers_replaced": 2, "late_match": 1}
    forgotten = [d for d in report["differences"] if d["reason"] == "consumers_replaced"]
    assert [d["remote_identifier"] for d in forgotten] == ["C-0", "C-1"]
    assert {d["event"]["id"] for d in forgotten} == {event.pk}


def test_a_hash_a_full_replacement_took_from_a_listed_consumer_is_explained_by_it(
    cycle: DropCycle, tmp_path: Path
) -> None:
    """C-0 is listed with another email: the match of its old one is explained by the
    replacement that forgot it, not reported as a hash lost outside the service."""
    other = base64.b64encode(bytes(32)).decode()
    replaced_by(tmp_path, f"C-0,email,{other}\nC-1,email,{ITEMS[1][1]}\n")
    event = LedgerEvent.objects.get(kind="consumers.replaced")
    assert event.data["hashes_forgotten"] == 1

    code, report = rematch_json(cycle)

    assert code == 0
    assert report["summary"]["explained"] == {"hashes_replaced": 1}
    (difference,) = report["differences"]
    assert (difference["remote_identifier"], difference["event"]["id"]) == ("C-0", event.pk)


def test_a_replacement_that_forgot_no_hash_does_not_explain_a_lost_one(
    cycle: DropCycle, tmp_path: Path
) -> None:
    replaced_by(tmp_path, f"C-0,email,{ITEMS[0][1]}\n")
    with connection.cursor() as cursor:  # C-0's hash lost behind the service's back
        cursor.execute(
            "DELETE FROM integrations_consumerhash h USING integrations_consumer c"
            " WHERE c.id = h.consumer_id AND c.remote_identifier = 'C-0'"
        )

    code, report = rematch_json(cycle)

    assert code == 1
    assert report["summary"]["unexplained"] == {"hash_missing": 1}
