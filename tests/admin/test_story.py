"""A work item's page tells its story, oldest first, each step linked to its record and its
ledger event; the request and consumer pages lead to it."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    DeliveryAttempt,
    LedgerEvent,
    WorkItem,
)
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.ledger import ledger_event_append
from tests.builders import ReappearanceFactory, SampleCycle, sample_cycle, work_item_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


@pytest.fixture
def world(broker: Broker) -> SampleCycle:
    world = sample_cycle(broker, today=timezone.localdate())
    request = world.requests["completed"]
    # The broker answered "deleted" a minute after the acknowledged delivery.
    attempt = DeliveryAttempt.objects.get(deletion_request=request)
    DeliveryAttempt.objects.filter(pk=attempt.pk).update(duration_ms=412)
    DeletionRequest.objects.filter(pk=request.pk).update(
        drop_outcome="deleted",
        drop_status_code=3,
        completed_at=attempt.started_at + dt.timedelta(minutes=1),
        matched_at=attempt.started_at - dt.timedelta(minutes=1),
    )
    ledger_event_append(
        kind=LedgerKind.DELETION_REQUEST_OUTCOME_RECORDED,
        broker_id=broker.broker_id,
        subject=str(request.request_uuid),
        actor="broker:4821",
        data={"drop_outcome": "deleted", "drop_status_code": 3},
    )
    return world


def story_of(staff: Client, work_item: WorkItem) -> str:
    page = staff.get(f"/admin/integrations/workitem/{work_item.pk}/change/").content.decode()
    assert "Story, oldest first" in page
    return page[page.index("Story, oldest first") :]


def step_titles(story: str) -> list[str]:
    return [
        re.sub(r"\s+", " ", title).strip()
        for title in re.findall(r'<p class="dp-step-title">(.*?)</p>', story, re.S)
    ]


def test_the_story_runs_from_drops_download_to_the_brokers_answer(
    staff: Client, world: SampleCycle
) -> None:
    request = world.requests["completed"]
    story = story_of(staff, work_item_of(request))
    titles = step_titles(story)
    assert titles[0] == f"DROP sent it in cycle {world.cycle.drop_session_id}"
    assert titles.index("Matched consumer C-1") < titles.index(
        "Delivery attempt 1 to Acme deletions (webhook)"
    )
    assert titles.index("Delivery attempt 1 to Acme deletions (webhook)") < titles.index(
        "The broker answered Deleted (3)"
    )
    assert "HTTP 200, 412 ms" in story
    # Each step links to its record; the outcome to its ledger event too.
    assert f"/admin/integrations/dropcycle/{world.cycle.pk}/change/" in story
    assert f"/admin/integrations/consumer/{world.consumer.pk}/change/" in story
    assert f"/admin/integrations/deletionrequest/{request.pk}/change/" in story
    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert f"/admin/integrations/ledgerevent/{event.pk}/change/" in story
    assert "outcome recorded" not in story.lower()  # one step, not told twice


def test_a_status_set_by_hand_says_by_whom(staff: Client, world: SampleCycle) -> None:
    item = work_item_of(world.requests["failed"])
    work_item_status_set(
        work_item=item, status_code=5, reason="consumer unknown to the CRM", actor="staff:bob"
    )
    titles = step_titles(story_of(staff, item))
    assert titles[-1] == "Status set by bob"
    event = LedgerEvent.objects.get(kind="work_item.status_set")
    assert f"/admin/integrations/ledgerevent/{event.pk}/change/" in story_of(staff, item)


def test_an_item_nobody_matched_says_status_5(staff: Client, world: SampleCycle) -> None:
    item = WorkItem.objects.filter(cycle=world.cycle, status_code=5).first()
    assert item is not None
    assert "No registered consumer matched: status 5 (not found)" in step_titles(
        story_of(staff, item)
    )


def test_the_request_and_consumer_pages_lead_to_the_story(
    staff: Client, world: SampleCycle
) -> None:
    request = world.requests["completed"]
    story_url = f"/admin/integrations/workitem/{request.work_item_id}/change/"
    request_page = staff.get(f"/admin/integrations/deletionrequest/{request.pk}/change/")
    assert f'href="{story_url}"><span' in request_page.content.decode()
    consumer_page = staff.get(f"/admin/integrations/consumer/{world.consumer.pk}/change/")
    assert f'href="{story_url}"' in consumer_page.content.decode()


def test_a_removed_item_says_drop_removed_it(staff: Client, world: SampleCycle) -> None:
    item = WorkItem.objects.get(cycle=world.cycle, state="removed")
    titles = step_titles(story_of(staff, item))
    assert titles[0] == f"DROP sent it in cycle {world.cycle.drop_session_id}"
    assert "DROP removed it from its list" in titles
    kept = WorkItem.objects.filter(cycle=world.cycle, state="reportable").first()
    assert kept is not None
    assert "DROP removed it from its list" not in step_titles(story_of(staff, kept))


def test_a_reappearance_says_when_and_from_which_source(staff: Client, world: SampleCycle) -> None:
    """Each registration again of a matched consumer is a step, with its source: the file and
    its SHA-256, or the API key's prefix."""
    item = work_item_of(world.requests["completed"])
    later = timezone.now() + dt.timedelta(days=30)
    from_file = ReappearanceFactory.create(
        work_item=item, remote_identifier="S-9", reappeared_at=later
    )
    ReappearanceFactory.create(
        work_item=item,
        remote_identifier="S-10",
        source="api",
        source_sha256="",
        api_key_prefix="dp_ab12",
        reappeared_at=later + dt.timedelta(days=1),
    )
    story = story_of(staff, item)
    titles = step_titles(story)
    assert titles[-2:] == [
        "Registered again: consumer S-9, a reappearance",
        "Registered again: consumer S-10, a reappearance",
    ]
    assert f"from file:supplier-a.csv, SHA-256 {from_file.source_sha256}" in story
    assert "through the API, key dp_ab12" in story
    assert f"/admin/integrations/reappearance/{from_file.pk}/change/" in story
    # Only this item's reappearances.
    other = work_item_of(world.requests["failed"])
    assert "a reappearance" not in " ".join(step_titles(story_of(staff, other)))
