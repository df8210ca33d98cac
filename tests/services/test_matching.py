"""Matching rules: deletion targets, late matches of consumers registered after a download,
and the per-broker lock that keeps an import and a registration from missing each other."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob
from psycopg import sql

from devtools.drop_simulator import work_items
from integrations.models import (
    Broker,
    Consumer,
    DeletionRequest,
    DropCycle,
    Integration,
    LedgerEvent,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle import drop_import, matching
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.cycle.matching import (
    LateMatches,
    consumer_hashes_match_late,
    late_added_create,
)
from integrations.services.cycle.requests import matches_table_create, requests_create_for_matches
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    ConsumerFactory,
    IsiConnectionFactory,
    WebhookIntegrationFactory,
    drop_zip,
    work_item_of,
    write_zip,
)
from tests.conftest import bearer

ITEMS = list(work_items(6))
EMAIL, PHONE = ITEMS[:4], ITEMS[4:]
DELIVERY_TASK = "integrations.tasks.deliver_deletion_requests"


def import_package(broker: Broker, directory: Path) -> DropCycle:
    path = write_zip(directory, drop_zip(broker, {"Email": EMAIL, "Phone": PHONE}))
    return drop_zip_import(broker=broker, path=path, actor="test").cycle


def register_late(broker: Broker, remote_identifier: str, **hashes: str) -> LateMatches:
    """What ``consumers_register`` does: insert hashes, list them, match them late."""
    with transaction.atomic():
        registered = ConsumerFactory.create(
            broker=broker, remote_identifier=remote_identifier, hashes=hashes
        )
        _list_as_new(broker, registered)
        return consumer_hashes_match_late(broker=broker, actor="test")


def _list_as_new(broker: Broker, registered: Consumer) -> None:
    """The late match's table of added hashes as a registration's merge fills it (by
    insert only): here, with the consumer's hashes."""
    added = late_added_create()
    with connection.cursor() as cursor:
        cursor.execute(
            sql.SQL(
                "INSERT INTO {added} (consumer_id, hash_type, hash)"
                " SELECT consumer_id, hash_type, hash FROM integrations_consumerhash"
                " WHERE broker_id = %s AND consumer_id = %s"
            ).format(added=added),
            [broker.pk, registered.pk],
        )


def item(work_item_id: str) -> WorkItem:
    return WorkItem.objects.get(work_item_id=work_item_id)


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path, db: None) -> DropCycle:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    return import_package(broker, tmp_path)


# ---------------------------------------------------------------- targets


@pytest.mark.django_db
def test_several_consumers_and_targets_multiply(broker: Broker, tmp_path: Path) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    ConsumerFactory.create(broker=broker, remote_identifier="C-2", hashes={"email": EMAIL[0][1]})
    hook = WebhookIntegrationFactory.create(broker=broker)
    connection_ = IsiConnectionFactory.create(integration__broker=broker)
    import_package(broker, tmp_path)
    requests = DeletionRequest.objects.filter(work_item__work_item_id=EMAIL[0][0])
    assert len(requests) == 4
    assert {(r.remote_identifier, r.integration_id, r.isi_connection_id) for r in requests} == {
        ("C-1", connection_.integration_id, connection_.pk),
        ("C-1", hook.pk, None),
        ("C-2", connection_.integration_id, connection_.pk),
        ("C-2", hook.pk, None),
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("isi_options", "target"),
    [
        pytest.param({}, True, id="taking-part"),
        pytest.param({"listed": False}, False, id="no-longer-listed"),
        # Paused, not gone.
        pytest.param({"integration__enabled": False}, True, id="integration-disabled"),
        pytest.param(
            {"integration__enabled": False, "retired": True}, False, id="integration-retired"
        ),
        pytest.param(
            {"capabilities": ["privacy/drop/identifiers"]}, False, id="no-delete-capability"
        ),
    ],
)
def test_only_isi_connections_taking_part_in_drop_are_targets(
    broker: Broker, tmp_path: Path, isi_options: dict[str, Any], target: bool
) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    isi_options = dict(isi_options)  # the parameter is shared between runs
    retired = isi_options.pop("retired", False)
    connection_ = IsiConnectionFactory.create(integration__broker=broker, **isi_options)
    if retired:
        Integration.objects.filter(pk=connection_.integration_id).update(
            retired_at=timezone.now(), retired_reason="decommissioned"
        )
    import_package(broker, tmp_path)
    request = DeletionRequest.objects.get()
    if target:
        assert request.isi_connection_id == connection_.pk
        assert request.state == RequestState.QUEUED
    else:
        assert request.isi_connection_id is None
        assert request.state == RequestState.PENDING


@pytest.mark.django_db
def test_requests_and_their_jobs_roll_back_together(broker: Broker, cycle: DropCycle) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    requests_before = DeletionRequest.objects.count()
    jobs_before = ProcrastinateJob.objects.filter(task_name=DELIVERY_TASK).count()
    with pytest.raises(RuntimeError), transaction.atomic():
        matches_table_create()
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO drop_matches (work_item_id, consumer_id)"
                " SELECT w.id, c.id FROM integrations_workitem w, integrations_consumer c"
                " WHERE w.work_item_id = %s",
                [EMAIL[2][0]],
            )
        created = requests_create_for_matches(
            broker=broker, match_date=timezone.localdate(), actor="test"
        )
        assert created.queued == 1
        raise RuntimeError("the caller fails after creating them")
    assert DeletionRequest.objects.count() == requests_before
    assert ProcrastinateJob.objects.filter(task_name=DELIVERY_TASK).count() == jobs_before


@pytest.mark.django_db
def test_matches_of_another_brokers_work_items_are_ignored(
    broker: Broker, cycle: DropCycle
) -> None:
    other = broker_create(broker_id="5555", name="Other", actor="test")
    with transaction.atomic():
        matches_table_create()
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO drop_matches (work_item_id, consumer_id)"
                " SELECT w.id, c.id FROM integrations_workitem w, integrations_consumer c"
            )
        created = requests_create_for_matches(
            broker=other, match_date=timezone.localdate(), actor="test"
        )
    assert created.deletion_requests == 0


# ---------------------------------------------------------------- late matches


@pytest.mark.django_db
def test_a_consumer_registered_later_gets_a_late_request_at_once(
    broker: Broker, cycle: DropCycle
) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    assert (item(EMAIL[1][0]).state, item(EMAIL[1][0]).status_code) == ("reportable", 5)
    late = register_late(broker, "C-9", email=EMAIL[1][1])
    request = DeletionRequest.objects.get(remote_identifier="C-9")
    assert request.late_match is True
    assert request.state == RequestState.QUEUED
    assert work_item_of(request).work_item_id == EMAIL[1][0]
    assert request.drop_session_id == cycle.drop_session_id
    assert request.identifier_hash == EMAIL[1][1]
    assert ProcrastinateJob.objects.filter(
        task_name=DELIVERY_TASK, args__request_ids__contains=[request.pk]
    ).exists()
    # Its status 5 no longer holds: open until the outcome arrives; never reported, so no
    # amendment is owed.
    matched = item(EMAIL[1][0])
    assert (matched.state, matched.status_code, matched.needs_amendment) == ("open", None, False)
    assert (late.work_items, late.newly_matched, late.flagged_for_amendment) == (1, 1, 0)
    event = LedgerEvent.objects.get(kind="drop.late_matched")
    assert event.data["deletion_requests"] == 1


@pytest.mark.django_db
def test_a_late_match_of_an_item_reported_as_5_flags_it_for_amendment(
    broker: Broker, cycle: DropCycle
) -> None:
    WorkItem.objects.filter(work_item_id=EMAIL[1][0]).update(
        state=WorkItemState.REPORTED, reported_status_code=5, reported_at=timezone.now()
    )
    late = register_late(broker, "C-9", email=EMAIL[1][1])
    flagged = item(EMAIL[1][0])
    assert (flagged.state, flagged.status_code, flagged.needs_amendment) == ("open", None, True)
    assert flagged.reported_status_code == 5  # what DROP has, until the amendment
    assert late.flagged_for_amendment == 1


@pytest.mark.django_db
def test_a_late_match_of_an_item_reported_as_deleted_keeps_its_status(
    broker: Broker, cycle: DropCycle
) -> None:
    WorkItem.objects.filter(work_item_id=EMAIL[0][0]).update(
        state=WorkItemState.REPORTED, status_code=3, reported_status_code=3
    )
    register_late(broker, "C-9", email=EMAIL[0][1])
    kept = item(EMAIL[0][0])
    assert (kept.state, kept.status_code, kept.needs_amendment) == ("reported", 3, False)
    assert DeletionRequest.objects.get(remote_identifier="C-9").late_match is True


@pytest.mark.django_db
def test_removed_work_items_get_no_late_request(broker: Broker, cycle: DropCycle) -> None:
    WorkItem.objects.filter(work_item_id=EMAIL[1][0]).update(
        state=WorkItemState.REMOVED, status_code=None
    )
    late = register_late(broker, "C-9", email=EMAIL[1][1])
    assert late.work_items == 0
    assert not DeletionRequest.objects.filter(remote_identifier="C-9").exists()
    assert not LedgerEvent.objects.filter(kind="drop.late_matched").exists()


@pytest.mark.django_db
def test_a_late_hash_of_another_list_type_or_broker_does_not_match(
    broker: Broker, cycle: DropCycle
) -> None:
    other = broker_create(broker_id="5555", name="Other", actor="test")
    assert register_late(broker, "C-9", phone=EMAIL[1][1]).work_items == 0
    assert register_late(other, "X-9", email=EMAIL[1][1]).work_items == 0
    assert item(EMAIL[1][0]).status_code == 5


@pytest.mark.django_db
def test_a_second_consumer_of_a_matched_item_adds_only_its_own_request(
    broker: Broker, cycle: DropCycle
) -> None:
    late = register_late(broker, "C-9", email=EMAIL[0][1])
    assert (late.work_items, late.newly_matched) == (1, 0)
    assert sorted(
        (r.remote_identifier, r.late_match)
        for r in DeletionRequest.objects.filter(work_item__work_item_id=EMAIL[0][0])
    ) == [("C-1", False), ("C-9", True)]


@pytest.mark.django_db
def test_matching_the_same_consumer_again_creates_nothing_new(
    broker: Broker, cycle: DropCycle
) -> None:
    register_late(broker, "C-9", email=EMAIL[1][1])
    again = Consumer.objects.get(remote_identifier="C-9")
    with transaction.atomic():
        _list_as_new(broker, again)
        assert consumer_hashes_match_late(broker=broker).work_items == 0
    assert DeletionRequest.objects.filter(remote_identifier="C-9").count() == 1


# ---------------------------------------------------------------- import vs registration


@pytest.fixture
def job_tables_emptied() -> Iterator[None]:
    yield
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE procrastinate_jobs, procrastinate_periodic_defers CASCADE")


@pytest.mark.django_db(transaction=True)
def test_a_consumer_registered_during_an_import_is_matched_by_one_side(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_tables_emptied: None
) -> None:
    """The import has joined (without the new, uncommitted consumer) and not committed yet;
    the registration's late match must wait for it, then see its work items."""
    joined, release = threading.Event(), threading.Event()
    original = matching.staged_items_match

    def join_then_hold(**kwargs: Any) -> int:
        matched = original(**kwargs)
        joined.set()
        release.wait(timeout=30)
        return matched

    monkeypatch.setattr(drop_import, "staged_items_match", join_then_hold)
    path = write_zip(tmp_path, drop_zip(broker, {"Email": EMAIL, "Phone": PHONE}))
    failures: list[BaseException] = []

    def run_import() -> None:
        try:
            drop_zip_import(broker=broker, path=path, actor="test")
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            connections.close_all()

    importer = threading.Thread(target=run_import)
    importer.start()
    assert joined.wait(timeout=30)

    def release_once_registration_waits() -> None:
        # Let the import commit only once the registration is blocked on the matching
        # lock (or after 10 s, when there is no such lock and the test must fail).
        deadline = time.monotonic() + 10
        with connections["default"].temporary_connection() as cursor:
            while time.monotonic() < deadline:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
                )
                if cursor.fetchone()[0]:
                    break
                time.sleep(0.02)
        release.set()

    releaser = threading.Thread(target=release_once_registration_waits)
    releaser.start()
    late = register_late(broker, "C-9", email=EMAIL[2][1])
    releaser.join()
    importer.join()
    assert not failures
    assert late.work_items == 1
    request = DeletionRequest.objects.get(remote_identifier="C-9")
    assert work_item_of(request).work_item_id == EMAIL[2][0]


# ---------------------------------------------------------------- through registration


@pytest.mark.django_db
def test_consumers_imported_later_are_matched_late(
    broker: Broker, cycle: DropCycle, tmp_path: Path
) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    csv = tmp_path / "consumers.csv"
    csv.write_text(
        "remote_identifier,hash_type,hash\r\n"
        f"C-7,email,{EMAIL[3][1]}\r\n"
        f"C-8,phone,{EMAIL[2][1]}\r\n"  # an email hash registered as a phone: no match
    )
    call_command("consumers", "import", "--broker", "4821", "--hashed", str(csv))
    request = DeletionRequest.objects.get(late_match=True)
    assert (request.remote_identifier, work_item_of(request).work_item_id) == ("C-7", EMAIL[3][0])
    assert request.state == RequestState.QUEUED
    assert item(EMAIL[3][0]).state == WorkItemState.OPEN
    assert item(EMAIL[2][0]).status_code == 5
    # Registering the same file again adds no hash, so nothing new is matched.
    call_command("consumers", "import", "--broker", "4821", "--hashed", str(csv))
    assert DeletionRequest.objects.filter(late_match=True).count() == 1


@pytest.mark.django_db
def test_consumers_registered_through_the_api_are_matched_late(
    broker: Broker, cycle: DropCycle, make_key: Any, api_client: Any
) -> None:
    key = make_key("ingest").key
    body = {"consumers": [{"remote_identifier": "C-7", "hashes": {"email": [EMAIL[3][1]]}}]}
    response = api_client.post("/api/v1/drop/consumers", body, format="json", **bearer(key))
    assert response.status_code == 200, response.content
    request = DeletionRequest.objects.get(late_match=True)
    assert (request.remote_identifier, work_item_of(request).work_item_id) == ("C-7", EMAIL[3][0])
    assert request.state == RequestState.PENDING  # no target configured yet: it waits
