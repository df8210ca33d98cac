"""A change page's object is read once per shown page (integrations/admin/page_object.py):
what the page's own view read is what Django's view shows, for that admin and that id only,
and a page that saves reads its object afresh."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext

from integrations.models import Broker, DropCycle, WorkItem
from tests.builders import DropCycleFactory, WorkItemFactory

pytestmark = pytest.mark.django_db


def reads_of(table: str, queries: list[dict[str, str]]) -> int:
    return sum(q["sql"].startswith(f'SELECT "{table}"."id"') for q in queries)


def test_a_cycles_and_a_work_items_page_read_their_row_once(client: Client, broker: Broker) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    item = WorkItemFactory.create(cycle=cycle)
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-1"))

    with CaptureQueriesContext(connection) as shown:
        page = client.get(f"/admin/integrations/dropcycle/{cycle.pk}/change/")
    assert page.status_code == 200
    assert cycle.drop_session_id in page.content.decode()
    assert reads_of("integrations_dropcycle", shown.captured_queries) == 1

    with CaptureQueriesContext(connection) as shown:
        page = client.get(f"/admin/integrations/workitem/{item.pk}/change/")
    assert page.status_code == 200
    assert reads_of("integrations_workitem", shown.captured_queries) == 1


def test_what_is_kept_is_for_that_admin_and_that_id_and_for_a_shown_page_only(
    broker: Broker,
) -> None:
    first = DropCycleFactory.create(broker=broker, drop_session_id="1")
    second = DropCycleFactory.create(broker=broker, drop_session_id="2")
    user = User.objects.create_superuser("alice", "a@example.com", "pw-alice-1")
    cycles, items = admin.site._registry[DropCycle], admin.site._registry[WorkItem]

    request = RequestFactory().get("/admin/")
    request.user = user
    kept = cycles.get_object(request, str(first.pk))
    assert cycles.get_object(request, str(first.pk)) is kept, "read twice on one shown page"
    assert cycles.get_object(request, str(second.pk)) == second
    # Another admin, the same id: its own model's row (or none), never the kept cycle.
    assert not isinstance(items.get_object(request, str(first.pk)), DropCycle)
    assert cycles.get_object(request, "0") is None
    assert RequestFactory().get("/admin/").__dict__.get("_dp_page_objects") is None

    posted = RequestFactory().post("/admin/")
    posted.user = user
    once = cycles.get_object(posted, str(first.pk))
    again = cycles.get_object(posted, str(first.pk))
    assert again is not once, "a page that saves must read its object afresh"
