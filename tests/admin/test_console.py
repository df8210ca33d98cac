"""The staff console: read-only records are "View" pages, labels say DROP/ISI/SaaS/Broker ID,
UUIDs are short and copyable, times say their zone, machinery tables are superusers' only."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    ResolutionRequest,
    SaasDeletion,
)
from integrations.services.ledger import ledger_event_append
from integrations.services.reporting.report_files import report_files_write
from tests.admin.markup import cells
from tests.browser.staff import make_staff
from tests.builders import (
    DropCycleFactory,
    SampleCycle,
    WorkItemFactory,
    items_reported,
    sample_cycle,
    work_item_of,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(broker: Broker) -> SampleCycle:
    return sample_cycle(broker, today=timezone.localdate())


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


def record_pages(world: SampleCycle) -> dict[str, str]:
    work_item = work_item_of(world.requests["failed"])
    return {
        "work item": f"/admin/integrations/workitem/{work_item.pk}/change/",
        "deletion request": (
            f"/admin/integrations/deletionrequest/{world.requests['failed'].pk}/change/"
        ),
        "resolution request": (
            f"/admin/integrations/resolutionrequest/{ResolutionRequest.objects.first().pk}/change/"  # type: ignore[union-attr]
        ),
        "SaaS deletion": (
            f"/admin/integrations/saasdeletion/{SaasDeletion.objects.get().pk}/change/"
        ),
        "ledger event": f"/admin/integrations/ledgerevent/{LedgerEvent.objects.first().pk}/change/",  # type: ignore[union-attr]
        "report file": f"/admin/integrations/reportfile/{world.report_file.pk}/change/",
        "DROP cycle": f"/admin/integrations/dropcycle/{world.cycle.pk}/change/",
    }


def test_read_only_records_are_view_pages_without_a_save_button(
    staff: Client, world: SampleCycle
) -> None:
    for name, url in record_pages(world).items():
        page = staff.get(url).content.decode()
        assert re.search(rf"<title>[^<]*\| View {name} \|", page), name
        assert 'name="_save"' not in page, name
        assert 'name="_continue"' not in page, name


def test_a_request_page_posted_to_changes_nothing(staff: Client, world: SampleCycle) -> None:
    request = world.requests["failed"]
    url = f"/admin/integrations/deletionrequest/{request.pk}/change/"
    assert staff.post(url, {"remote_identifier": "changed"}).status_code == 403
    request.refresh_from_db()
    assert request.remote_identifier == "C-1"


def test_labels_say_drop_isi_saas_and_broker_id(staff: Client, world: SampleCycle) -> None:
    request = world.requests["failed"]
    page = staff.get(f"/admin/integrations/deletionrequest/{request.pk}/change/").content.decode()
    for label in ("Broker ID", "DROP session ID", "ISI connection", "DROP outcome", "Request UUID"):
        assert f">{label}<" in page or f">{label}\n" in page or f"{label}</" in page, label
    assert "Broker_id" not in page
    assert "Drop session id" not in page
    index = staff.get("/admin/").content.decode()
    for name in ("DROP cycles", "SaaS deletions", "SaaS connections"):
        assert name in index, name
    for stale in ("Drop cycles", "Saas deletions", "Isi connection"):
        assert stale not in index, stale


def test_uuids_show_8_characters_whole_on_hover_with_a_copy_button(
    staff: Client, world: SampleCycle
) -> None:
    request = world.requests["failed"]
    full = str(request.request_uuid)
    listing = staff.get("/admin/integrations/deletionrequest/").content.decode()
    link = f"/admin/integrations/deletionrequest/{request.pk}/change/"
    assert f'<a href="{link}" title="{full}"><code>{full[:8]}</code></a>' in listing
    assert f'data-copy="{full}"' in listing
    assert f">{full}<" not in listing  # never written out whole
    page = staff.get(link).content.decode()
    assert f'<code title="{full}">{full[:8]}</code>' in page
    assert f'data-copy="{request.webhook_request_id}"' in page
    ledger_event_append(
        kind=LedgerKind.DELETION_REQUEST_REDISPATCHED, subject=full, actor="staff:alice", data={}
    )
    ledger = staff.get("/admin/integrations/ledgerevent/").content.decode()
    assert f'<code title="{full}">{full[:8]}</code>' in ledger
    integration = world.integration
    page = staff.get(f"/admin/integrations/integration/{integration.pk}/change/").content.decode()
    assert f'<code title="{integration.uuid}">{str(integration.uuid)[:8]}</code>' in page


def test_times_are_shown_in_drops_zone_with_its_abbreviation(
    staff: Client, world: SampleCycle, settings: object
) -> None:
    request = world.requests["failed"]
    when = dt.datetime(2026, 7, 4, 18, 30, tzinfo=dt.UTC)  # 11:30 in California (PDT)
    DeletionRequest.objects.filter(pk=request.pk).update(dispatched_at=when)
    listing = staff.get("/admin/integrations/deletionrequest/?state__exact=failed").content
    assert cells(listing.decode(), "dispatched_at") == ["Jul 4, 2026, 11:30 PDT"]
    page = staff.get(f"/admin/integrations/deletionrequest/{request.pk}/change/").content
    assert "Jul 4, 2026, 11:30 PDT" in page.decode()
    dashboard = staff.get("/admin/").content.decode()  # the last download, in California time
    assert re.search(r"Last DROP download.{0,200}\d\d:\d\d P[SD]T", dashboard, re.S)


def test_a_different_drop_zone_moves_the_times(
    staff: Client, world: SampleCycle, settings: object
) -> None:
    settings.DROPPORTAL_DROP_TIMEZONE = "UTC"  # type: ignore[attr-defined]
    request = world.requests["failed"]
    when = dt.datetime(2026, 1, 4, 18, 30, tzinfo=dt.UTC)
    DeletionRequest.objects.filter(pk=request.pk).update(dispatched_at=when)
    listing = staff.get("/admin/integrations/deletionrequest/?state__exact=failed").content
    assert cells(listing.decode(), "dispatched_at") == ["Jan 4, 2026, 18:30 UTC"]


MACHINERY = ["/admin/axes/accessattempt/", "/admin/procrastinate/procrastinatejob/"]


def test_lockout_and_job_tables_are_for_superusers_only(client: Client, world: SampleCycle) -> None:
    auditor = make_staff("audrey", "Auditors")
    # Even granted by mistake, their permissions show these tables to no one else.
    auditor.user_permissions.add(
        *Permission.objects.filter(content_type__app_label__in=["axes", "procrastinate"])
    )
    client.force_login(auditor)
    for url in MACHINERY:
        assert client.get(url).status_code == 403, url
    index = client.get("/admin/").content.decode()
    assert "Access attempts" not in index
    assert "Superusers only" not in index
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-1"))
    for url in MACHINERY:
        assert client.get(url).status_code == 200, url
    assert "Superusers only" in client.get("/admin/").content.decode()


def test_a_cycle_page_counts_a_written_status_as_owed_until_drop_takes_it(
    staff: Client, broker: Broker
) -> None:
    cycle = DropCycleFactory.create(broker=broker, drop_session_id="3")
    items_reported(
        cycle, [WorkItemFactory.create(cycle=cycle, status_code=3)]
    )  # DROP took this one
    WorkItemFactory.create(cycle=cycle, status_code=5)
    report_files_write(broker=broker)  # written for a manual upload, not uploaded yet

    page = staff.get(f"/admin/integrations/dropcycle/{cycle.pk}/change/").content.decode()

    assert '<dd id="dp-reported">1</dd>' in page
    assert '<dd id="dp-owed">1</dd>' in page


def test_every_list_keeps_its_columns_few_enough_for_1280_pixels(
    staff: Client, world: SampleCycle
) -> None:
    # The browser tests measure the width; this keeps the column count honest without one.
    listing = staff.get("/admin/integrations/deletionrequest/").content.decode()
    header = listing[listing.index("<thead") : listing.index("</thead>")]
    assert len(re.findall(r"<th[ >]", header)) <= 10


def test_a_cycle_page_shows_its_days_today_and_the_statuses_known_reported_and_owed(
    staff: Client, broker: Broker
) -> None:
    drop_today = timezone.localdate(timezone=ZoneInfo(django_settings.DROPPORTAL_DROP_TIMEZONE))
    world = sample_cycle(broker, today=drop_today)
    page = staff.get(f"/admin/integrations/dropcycle/{world.cycle.pk}/change/").content.decode()
    assert "Day 10 of 45: 35 days left" in page
    assert '<dd id="dp-known">10</dd>' in page  # 3 + 1 + 6 reportable; the removed one owes none
    assert '<dd id="dp-reported">0</dd>' in page
    assert '<dd id="dp-owed">14</dd>' in page
    assert "chart-timeline" in page
    assert f"/admin/integrations/workitem/?cycle__id__exact={world.cycle.pk}" in page
    reported = staff.get(f"/admin/integrations/dropcycle/{world.previous.pk}/change/")
    text = reported.content.decode()
    assert '<dd id="dp-reported">16</dd>' in text and '<dd id="dp-owed">0</dd>' in text
    # Past its due date, and reported: late for nothing (the cycles list says the same).
    assert "Day 60 of 45: nothing owed" in text


def test_the_javascript_catalog_is_cached_by_the_staff_browser_and_kept_from_others(
    client: Client,
) -> None:
    anonymous = client.get("/admin/jsi18n/")
    assert anonymous.status_code == 302
    assert "max-age" not in anonymous.get("Cache-Control", "")
    client.force_login(make_staff("olga", "Operators"))
    catalog = client.get("/admin/jsi18n/")
    assert catalog.status_code == 200
    assert catalog["Content-Type"].startswith("text/javascript")
    assert set(catalog["Cache-Control"].split(", ")) == {"private", "max-age=3600"}
