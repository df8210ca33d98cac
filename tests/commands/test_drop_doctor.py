"""``drop doctor``: every open work item no automatic path brings to a DROP status, grouped
by broker and reason, with counts, the nearest due date and the admin list; exit 1 when there
is any. The periodic job runs the same check and the dashboard's broker card shows it.

One world holds a work item stuck for each reason next to items whose path is live (queued,
dispatched yesterday, removed by DROP); each test reads it through a different surface.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from integrations import tasks
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DropCycle,
    Integration,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.stuck import StuckReason, stuck_work_items
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.integrations import integration_disable
from integrations.services.staff.saas import saas_connection_disable
from tests.builders import (
    MATCH_DATE,
    DeletionRequestFactory,
    DropCycleFactory,
    ResolutionRequestFactory,
    SaasConnectionFactory,
    SaasDeletionFactory,
    WorkItemFactory,
    items_reported,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db

DUE = MATCH_DATE + dt.timedelta(days=45)


@dataclass
class World:
    broker: Broker
    other: Broker
    crm: Integration
    old: Integration


@pytest.fixture
def world(broker: Broker) -> World:
    crm = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    old = webhook_integration_created(
        broker, "https://old.acme.example/drop", name="Old"
    ).integration
    now = timezone.now()
    # Stuck, one per reason.
    DeletionRequestFactory.create(work_item__cycle__broker=broker, state=RequestState.PENDING)
    DeletionRequestFactory.create(integration=crm, state=RequestState.FAILED, drop_outcome="failed")
    DeletionRequestFactory.create(integration=crm, state=RequestState.UNDELIVERABLE)
    DeletionRequestFactory.create(
        integration=crm, state=RequestState.DISPATCHED, dispatched_at=now - dt.timedelta(days=8)
    )
    ResolutionRequestFactory.create(integration=crm, state=RequestState.FAILED)
    DeletionRequestFactory.create(integration=old, state=RequestState.QUEUED)
    integration_disable(integration=old, reason="broker moved", actor="test")
    # Live: queued, dispatched yesterday; and a removed item owes nothing.
    DeletionRequestFactory.create(integration=crm, state=RequestState.QUEUED)
    DeletionRequestFactory.create(
        integration=crm, state=RequestState.DISPATCHED, dispatched_at=now - dt.timedelta(days=1)
    )
    removed = WorkItemFactory.create(cycle__broker=broker)
    removed.state = WorkItemState.REMOVED
    removed.save()
    DeletionRequestFactory.create(work_item=removed, state=RequestState.PENDING)
    # Another broker whose DROP key was refused: its items cannot reach DROP.
    other = broker_create(broker_id="1234", name="Other", actor="test")
    other_crm = webhook_integration_created(other, "https://crm.other.example/drop").integration
    DeletionRequestFactory.create(integration=other_crm, state=RequestState.QUEUED)
    ledger_event_append(
        kind=LedgerKind.DROP_PULL_FAILED,
        broker_id="1234",
        subject="1234",
        actor="system:auto-pull",
        data={"error": "DROP refused the API key (HTTP 401)", "status": 401},
    )
    return World(broker, other, crm, old)


EXPECTED = {
    ("1234", "drop_key_refused"),
    ("4821", "pending_without_target"),
    ("4821", "failed_waiting_for_staff"),
    ("4821", "undeliverable"),
    ("4821", "no_callback"),
    ("4821", "resolution_stuck"),
    ("4821", "target_disabled"),
}


def test_the_selector_groups_every_stuck_item_by_broker_and_reason(world: World) -> None:
    groups = stuck_work_items()

    assert {(g.broker_id, str(g.reason)) for g in groups} == EXPECTED
    assert all(g.work_items == 1 and g.nearest_due_date == DUE for g in groups)
    assert stuck_work_items(broker=world.other) == [
        g for g in groups if g.reason == StuckReason.DROP_KEY_REFUSED
    ]


def test_the_automatic_redispatch_policy_is_a_live_path_until_it_gives_up(
    world: World, settings: Any
) -> None:
    settings.DROPPORTAL_AUTO_REDISPATCH_HOURS = 6
    reasons = {g.reason for g in stuck_work_items(broker=world.broker)}
    assert StuckReason.FAILED_WAITING_FOR_STAFF not in reasons


def test_json_is_one_object_and_the_exit_is_1(world: World) -> None:
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("drop", "doctor", "--json", stdout=out, stderr=io.StringIO())

    assert exited.value.code == 1
    printed = json.loads(out.getvalue())
    assert printed["stuck"] is True
    assert printed["work_items"] == len(EXPECTED)
    assert {(g["broker_id"], g["reason"]) for g in printed["groups"]} == EXPECTED
    pending = next(g for g in printed["groups"] if g["reason"] == "pending_without_target")
    assert pending["nearest_due_date"] == DUE.isoformat()
    assert pending["admin_url"].endswith(
        f"/admin/integrations/deletionrequest/?broker__id__exact={world.broker.pk}"
        "&state__exact=pending"
    )


def test_without_json_one_line_per_group_on_stderr(world: World) -> None:
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("drop", "doctor", "--broker", "4821", stdout=io.StringIO(), stderr=err)

    assert exited.value.code == 1
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == len(EXPECTED) - 1  # the other broker is left out
    assert all(line.startswith("broker 4821: 1 work item(s) ") for line in lines)
    assert any("[target_disabled]" in line and "/admin/integrations/integration/" in line
               and f"integration 'Old' ({world.old.uuid})" in line for line in lines)  # fmt: skip


def test_items_waiting_for_a_disabled_target_name_each_target(world: World) -> None:
    """A paused integration or SaaS connection is still a target: what waits for it is
    listed under target_disabled, naming the targets staff must enable (or retire)."""
    mailer = SaasConnectionFactory.create(
        broker=world.broker, url="https://api.mailer.example/erase", name="Mailer"
    )
    SaasDeletionFactory.create(
        resolution=ResolutionRequestFactory.create(
            integration=world.crm, state=RequestState.COMPLETED
        ),
        saas_connection=mailer,
    )
    saas_connection_disable(connection=mailer, reason="HTTP 410", actor="test")

    (group,) = [g for g in stuck_work_items() if g.reason == StuckReason.TARGET_DISABLED]

    assert group.targets == (
        f"SaaS connection 'Mailer' ({mailer.uuid})",
        f"integration 'Old' ({world.old.uuid})",
    )
    assert group.work_items == 2
    assert group.label.startswith("waiting for a disabled target: SaaS connection 'Mailer'")
    assert group.as_json()["targets"] == list(group.targets)
    # No longer counted as a stuck retrieval: enabling the connection is the way out.
    assert not any(
        g.reason == StuckReason.RESOLUTION_STUCK and g.work_items > 1 for g in stuck_work_items()
    )


def test_a_healthy_service_exits_0(broker: Broker) -> None:
    out = io.StringIO()
    call_command("drop", "doctor", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "stuck": False,
        "work_items": 0,
        "groups": [],
        "drop_access_obligations": [],
        "directives_not_acknowledged": [],
    }


def test_admin_links_open_the_list_that_holds_them(world: World, admin_client: Client) -> None:
    for group in stuck_work_items():
        response = admin_client.get(group.admin_path)
        # 200, not the 302 to "?e=1" the admin answers a filter it does not allow.
        assert response.status_code == 200, group.admin_path


def test_the_periodic_job_records_changes_and_the_dashboard_shows_them(
    world: World, admin_client: Client
) -> None:
    assert tasks.drop_doctor() == len(EXPECTED)
    assert tasks.drop_doctor() == len(EXPECTED)  # the same result: nothing new recorded

    events = LedgerEvent.objects.filter(kind="drop.doctor_checked")
    assert sorted(events.values_list("broker_id", flat=True)) == ["1234", "4821"]
    page = admin_client.get("/admin/").content.decode()
    assert "Stuck work items" in page
    assert "pending without a target" in page
    assert "DROP refused the broker&#x27;s key" in page

    # Staff settle it all: the next run records the broker healthy and the card says nothing.
    DropCycle.objects.filter(broker=world.broker).update(state="reported")
    WorkItem.objects.filter(broker=world.broker, state=WorkItemState.OPEN).update(
        state=WorkItemState.REPORTABLE, status_code=5
    )
    tasks.drop_doctor()
    latest = events.filter(broker_id="4821").latest("id")
    assert latest.data == {"stuck_work_items": 0, "groups": []}
    page = admin_client.get("/admin/").content.decode()
    assert "pending without a target" not in page


def test_items_in_a_file_drop_refused_or_rejected_are_listed(
    broker: Broker, admin_client: Client
) -> None:
    refused_cycle = DropCycleFactory.create(broker=broker, drop_session_id="7", due_in_days=30)
    amended = WorkItemFactory.create(
        cycle=refused_cycle, status_code=3, work_item_id="Refused00001"
    )
    refused = items_reported(refused_cycle, [amended], kind="amend", state=ReportFileState.REFUSED)
    ReportFile.objects.filter(pk=refused.pk).update(
        drop_response={"message": "not possible", "status": 409}
    )
    rejected_cycle = DropCycleFactory.create(
        broker=broker, drop_session_id="8", match_date=dt.date(2026, 3, 20)
    )
    owed = WorkItemFactory.create(cycle=rejected_cycle, status_code=5, work_item_id="Rejected0001")
    items_reported(rejected_cycle, [WorkItemFactory.create(cycle=rejected_cycle, status_code=3)])
    items_reported(rejected_cycle, [owed], state=ReportFileState.REJECTED)

    (group,) = stuck_work_items(broker=broker)

    assert (group.reason, group.work_items) == (StuckReason.REPORT_FILE_REFUSED, 2)
    assert group.nearest_due_date == refused_cycle.due_date
    assert admin_client.get(group.admin_path).status_code == 200
    err = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("drop", "doctor", "--broker", "4821", stdout=io.StringIO(), stderr=err)
    assert "[report_file_refused]" in err.getvalue()

    # DROP takes the refused file; a new file follows the rejected one: nothing is listed.
    ReportFile.objects.filter(pk=refused.pk).update(state=ReportFileState.ACCEPTED)
    items_reported(rejected_cycle, [owed])
    assert stuck_work_items(broker=broker) == []
