"""An admin action takes at most ``ROWS_PER_RUN`` rows of its selection a run, oldest first
(``integrations/admin/bounded_actions.py``), and says what it left: "select all" over
thousands of rows is done in runs that each end in time. The bound is set to 3 here."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from procrastinate.contrib.django.models import ProcrastinateJob

from dropportal.admin import DropportalAdminSite
from integrations.admin import bounded_actions
from integrations.models import (
    Broker,
    Consumer,
    DeletionRequest,
    Directive,
    Integration,
    LedgerEvent,
    RequestState,
    SaasConnection,
    WorkItem,
    WorkItemState,
)
from tests.builders import (
    ConsumerFactory,
    DeletionRequestFactory,
    DirectiveFactory,
    DropCycleFactory,
    SaasConnectionFactory,
    ServiceProviderFactory,
    WorkItemFactory,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db

REQUESTS = "/admin/integrations/deletionrequest/"
WORK_ITEMS = "/admin/integrations/workitem/"
CONSUMERS = "/admin/integrations/consumer/"
SAAS = "/admin/integrations/saasconnection/"
DIRECTIVES = "/admin/integrations/directive/"
JOBS = "/admin/procrastinate/procrastinatejob/"


def _all(pks: list[int]) -> dict[str, Any]:
    """The list's "Select all" (its filters applied), posted with the page's rows ticked."""
    return {"select_across": "1", "index": "0", "_selected_action": pks[-1:]}


@pytest.fixture(autouse=True)
def three_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded_actions, "ROWS_PER_RUN", 3)


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


@pytest.fixture
def integration(broker: Broker) -> Integration:
    return webhook_integration_created(broker, "https://crm.acme.example/drop").integration


def _page(response: Any) -> str:
    """The page's text, each run of white space one space."""
    return re.sub(r"\s+", " ", response.content.decode().replace("&#x27;", "'"))


def _undeliverable(integration: Integration, count: int) -> list[int]:
    return [
        DeletionRequestFactory.create(integration=integration, state=RequestState.UNDELIVERABLE).pk
        for _ in range(count)
    ]


def _queued(pks: list[int]) -> list[int]:
    return sorted(
        DeletionRequest.objects.filter(pk__in=pks, state=RequestState.QUEUED).values_list(
            "pk", flat=True
        )
    )


def test_redeliver_takes_the_first_rows_and_the_next_run_the_rest(
    staff: Client, integration: Integration
) -> None:
    pks = _undeliverable(integration, 5)
    run = {"action": "redeliver", **_all(pks)}
    undeliverable = f"{REQUESTS}?state__exact=undeliverable"

    first = _page(staff.post(undeliverable, run, follow=True))

    assert _queued(pks) == pks[:3]  # oldest first
    assert "Queued for redelivery: 3." in first
    assert "This run took the first 3 of the 5 selected" in first
    assert "2 left as they were. Run the action again for the rest." in first

    second = _page(staff.post(undeliverable, run, follow=True))

    assert _queued(pks) == pks
    assert "Queued for redelivery: 2." in second
    assert "This run took" not in second  # the rest fitted in one run
    events = LedgerEvent.objects.filter(kind="deletion_request.redelivery_requested")
    assert events.count() == 5  # each row once


def test_redeliver_says_when_running_again_would_take_the_same_rows(
    staff: Client, integration: Integration
) -> None:
    pks = _undeliverable(integration, 4)

    page = _page(staff.post(REQUESTS, {"action": "redeliver", **_all(pks)}, follow=True))

    assert _queued(pks) == pks[:3]
    assert "This run took the first 3 of the 4 selected" in page
    # Unfiltered, the list still holds the queued rows: a second run would take them again.
    assert "3 of those it took are still in the selection" in page
    assert "narrow the list to the rest first" in page
    assert "Run the action again for the rest" not in page


def test_a_selection_within_the_bound_is_taken_whole_without_a_note(
    staff: Client, integration: Integration
) -> None:
    pks = _undeliverable(integration, 3)

    page = _page(staff.post(REQUESTS, {"action": "redeliver", **_all(pks)}, follow=True))

    assert _queued(pks) == pks
    assert "Queued for redelivery: 3." in page
    assert "This run took" not in page


def test_setting_a_status_states_and_takes_what_one_run_takes(
    staff: Client, broker: Broker
) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    items = [WorkItemFactory.create(cycle=cycle, work_item_id=f"Open{n}") for n in range(5)]
    open_items = f"{WORK_ITEMS}?state__exact=open"
    chosen = {"action": "set_work_item_status", **_all([item.pk for item in items])}
    answer = {**chosen, "apply": "1", "status_code": "5", "reason": "No record left"}

    form_page = _page(staff.post(open_items, chosen))

    assert "3 work items: Open0, Open1, Open2</p>" in form_page  # the count it will handle
    assert "Open3" not in form_page and "Open4" not in form_page
    assert "This run takes the first 3 of the 5 selected" in form_page

    first = _page(staff.post(open_items, answer, follow=True))

    def with_status() -> list[str]:
        done = WorkItem.objects.filter(status_code=5, state=WorkItemState.REPORTABLE)
        return sorted(done.values_list("work_item_id", flat=True))

    assert with_status() == ["Open0", "Open1", "Open2"]
    assert "Set the status of 3 work item(s)." in first
    assert "This run took the first 3 of the 5 selected" in first
    assert "Run the action again for the rest." in first  # they left "State: open"

    second = _page(staff.post(open_items, answer, follow=True))

    assert with_status() == [item.work_item_id for item in items]
    assert "Set the status of 2 work item(s)." in second
    assert "This run took" not in second


def test_disabling_connections_takes_the_first_enabled_ones(staff: Client, broker: Broker) -> None:
    pks = [SaasConnectionFactory.create(broker=broker, name=f"CRM {n}").pk for n in range(4)]

    def disabled() -> list[int]:
        return sorted(SaasConnection.objects.filter(enabled=False).values_list("pk", flat=True))

    first = _page(staff.post(SAAS, {"action": "disable_connections", **_all(pks)}, follow=True))

    assert disabled() == pks[:3]
    assert "Disabled 3 SaaS connection(s)." in first
    assert "1 left as they were. Run the action again for the rest." in first

    staff.post(SAAS, {"action": "disable_connections", **_all(pks)})

    assert disabled() == pks


def test_disabling_counts_the_enabled_ones_of_the_selection(staff: Client, broker: Broker) -> None:
    pks = [SaasConnectionFactory.create(broker=broker, name=f"CRM {n}").pk for n in range(6)]
    SaasConnection.objects.filter(pk__in=pks[:2]).update(enabled=False)

    page = _page(staff.post(SAAS, {"action": "disable_connections", **_all(pks)}, follow=True))

    assert "Disabled 3 SaaS connection(s)." in page
    assert "This run took the first 3 of the 4 enabled in the selection" in page
    assert "1 left as they were. Run the action again for the rest." in page


def test_delete_selected_confirms_and_deletes_one_run_of_rows(
    staff: Client, broker: Broker
) -> None:
    pks = [ConsumerFactory.create(broker=broker).pk for _ in range(5)]
    chosen = {"action": "delete_selected", **_all(pks)}

    confirmation = _page(staff.post(CONSUMERS, chosen))

    assert "Only the first 3 of the 5 selected are listed below" in confirmation
    assert "select the 2 left again afterwards" in confirmation
    posted = confirmation.count('name="_selected_action"')
    assert posted == 3  # what the confirmation posts back: those 3 only
    for pk in pks[:3]:
        assert f'name="_selected_action" value="{pk}"' in confirmation
    assert 'name="select_across"' not in confirmation

    staff.post(CONSUMERS, {"action": "delete_selected", "post": "yes", "_selected_action": pks[:3]})

    assert sorted(Consumer.objects.values_list("pk", flat=True)) == pks[3:]
    assert LedgerEvent.objects.filter(kind="consumer.forgotten").count() == 3

    # A crafted confirmation of "select all" deletes no more than a run either.
    page = _page(staff.post(CONSUMERS, {**chosen, "post": "yes"}, follow=True))

    assert not Consumer.objects.exists()
    assert "This run took" not in page  # the 2 left fitted in one run


def test_delete_selected_reads_only_the_rows_it_lists(
    staff: Client, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    pks = [ConsumerFactory.create(broker=broker).pk for _ in range(5)]
    read: list[int] = []
    from_db = Consumer.from_db.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Consumer], *args: Any) -> Consumer:
        row = from_db(cls, *args)
        read.append(row.pk)
        return row

    monkeypatch.setattr(Consumer, "from_db", classmethod(counted))

    staff.post(CONSUMERS, {"action": "delete_selected", **_all(pks)})

    # The run's keys are read as keys: no row past the run is read, only those the page lists.
    assert set(read) == set(pks[:3])


def test_a_selection_past_the_count_cap_is_named_as_such(
    staff: Client, integration: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounded_actions.CappedCountPaginator, "cap", 4)
    pks = _undeliverable(integration, 6)

    page = _page(staff.post(REQUESTS, {"action": "redeliver", **_all(pks)}, follow=True))

    assert "This run took the first 3 of the 4+ selected" in page
    assert "1+ left as they were" in page


def test_writing_directives_again_queues_one_run_of_them(staff: Client, broker: Broker) -> None:
    provider = ServiceProviderFactory.create(broker=broker, s3_prefix="s3://mailhouse/drop/")
    pks = [DirectiveFactory.create(provider=provider).pk for _ in range(5)]
    run = {"action": "write_directives_again", **_all(pks)}

    page = _page(staff.post(DIRECTIVES, run, follow=True))

    events = LedgerEvent.objects.filter(kind="directive.write_queued")
    assert sorted(int(e.subject) for e in events) == pks[:3]  # oldest first
    assert "Queued 3 directive(s) to be written again" in page
    assert "This run took the first 3 of the 5 selected" in page
    # Queued, not written: they stay in the selection until a job writes them.
    assert "3 of those it took are still in the selection" in page
    assert Directive.objects.filter(s3_uri="").count() == 5


def _failed_job() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args) "
            "VALUES ('alerts', 'integrations.tasks.evaluate_alerts', 'failed', '{}') RETURNING id"
        )
        return int(cursor.fetchone()[0])


def test_a_job_action_takes_one_run_and_records_those(staff: Client) -> None:
    pks = [_failed_job() for _ in range(5)]
    failed = f"{JOBS}?status__exact=failed"

    page = _page(staff.post(failed, {"action": "retry", **_all(pks)}, follow=True))

    retried = ProcrastinateJob.objects.filter(pk__in=pks, status="todo").values_list("pk")
    assert sorted(pk for (pk,) in retried) == pks[:3]
    assert "This run took the first 3 of the 5 selected" in page
    assert "Run the action again for the rest." in page  # retried, they left "failed"
    (event,) = LedgerEvent.objects.filter(kind="machinery.changed")
    assert event.data["ids"] == pks[:3]


def test_every_project_admin_site_offers_the_bounded_delete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    action = DropportalAdminSite(name="another").get_action("delete_selected")
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(bounded_actions, "delete_selected", lambda *given: calls.append(given))

    assert action is not django_delete_selected
    assert action.allowed_permissions == ["delete"]  # offered only to who may delete
    action("modeladmin", "request", "queryset")

    assert calls == [("modeladmin", "request", "queryset")]
