"""Reappearances: a registration brings back a consumer whose suppressed hash the broker had
matched already. Dispatched at once as a late match, recorded with its source (a file and
its SHA-256, or the API key), counted by ``drop reappearances`` and in the admin."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.test import APIClient

from integrations.drop.calendar import drop_date
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    Reappearance,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle.consumers import consumer_forget
from integrations.services.staff.keys import CreatedApiKey
from tests.builders import (
    ConsumerFactory,
    DeletionRequestFactory,
    DropCycleFactory,
    WebhookIntegrationFactory,
    WorkItemFactory,
)
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="  # Anna.Smith@Domain.com
PHONE = "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="  # +1(415)555-9317
FRESH = base64.b64encode(hashlib.sha256(b"never matched").digest()).decode()


@pytest.fixture
def deleted(broker: Broker) -> WorkItem:
    """Anna's email: DROP sent it, consumer C-1 matched it, the broker deleted her and DROP
    holds 3; the broker then forgot C-1. A phone DROP sent matched nobody (5)."""
    integration = WebhookIntegrationFactory.create(broker=broker)
    cycle = DropCycleFactory.create(broker=broker)
    item = WorkItemFactory.create(
        cycle=cycle, hash=base64.b64decode(ANNA), reported=True, status_code=3
    )
    WorkItemFactory.create(
        cycle=cycle, list_type="Phone", hash=base64.b64decode(FRESH), reported=True
    )
    consumer = ConsumerFactory.create(
        broker=broker, remote_identifier="C-1", hashes={"email": ANNA}
    )
    DeletionRequestFactory.create(
        integration=integration, work_item=item, consumer=consumer, completed=True
    )
    consumer_forget(broker=broker, remote_identifier="C-1", actor="test")
    return item


def import_file(tmp_path: Path, text: str, *args: str) -> str:
    path = tmp_path / "supplier-a.csv"
    path.write_text(text)
    call_command("consumers", "import", "--broker", "4821", "--hashed", *args, str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_that_brings_a_deleted_consumer_back_is_a_reappearance(
    broker: Broker, deleted: WorkItem, tmp_path: Path
) -> None:
    sha256 = import_file(
        tmp_path,
        "remote_identifier,hash_type,hash\n"
        f"S-9,email,{ANNA}\n"  # Anna again, under the supplier's pointer
        f"S-10,phone,{FRESH}\n",  # a first match of a 5: a late match, not a reappearance
    )

    reappeared = Reappearance.objects.get()
    assert (reappeared.remote_identifier, reappeared.work_item) == ("S-9", deleted)
    assert (reappeared.source, reappeared.source_sha256) == ("file:supplier-a.csv", sha256)
    assert reappeared.api_key_prefix == "" and reappeared.consumer is not None
    # Dispatched at once, as a late match, to the same target.
    request = DeletionRequest.objects.get(remote_identifier="S-9")
    assert request.late_match and request.state == RequestState.QUEUED
    # What DROP holds does not change: the item stays reported as deleted.
    deleted.refresh_from_db()
    assert (deleted.state, deleted.reported_status_code) == (WorkItemState.REPORTED, 3)
    event = LedgerEvent.objects.get(kind="consumers.reappeared")
    assert event.data == {
        "source": "file:supplier-a.csv",
        "source_sha256": sha256,
        "api_key_prefix": "",
        "reappearances": 1,
        "work_items": 1,
    }


def test_an_api_registration_names_its_key(
    broker: Broker,
    deleted: WorkItem,
    api_client: APIClient,
    make_key: Callable[..., CreatedApiKey],
) -> None:
    key = make_key("ingest")
    body = {"consumers": [{"remote_identifier": "S-9", "email": ["Anna.Smith@Domain.com"]}]}

    response = api_client.post("/api/v1/drop/consumers", body, format="json", **bearer(key.key))

    assert response.status_code == 200
    reappeared = Reappearance.objects.get()
    assert (reappeared.source, reappeared.api_key_prefix) == ("api", key.api_key.prefix)
    assert reappeared.source_label == f"api key {key.api_key.prefix}"
    assert DeletionRequest.objects.get(remote_identifier="S-9").late_match


def test_a_replace_that_brings_her_back_is_one_and_forgetting_keeps_the_record(
    broker: Broker, deleted: WorkItem, tmp_path: Path
) -> None:
    header = "remote_identifier,hash_type,hash\n"
    import_file(tmp_path, header + f"S-1,phone,{PHONE}\n")
    sha256 = import_file(tmp_path, header + f"S-1,phone,{PHONE}\nS-9,email,{ANNA}\n", "--replace")
    assert Reappearance.objects.get().source_sha256 == sha256

    # The supplier's next full set no longer lists her: she is forgotten, the record stays.
    import_file(tmp_path, header + f"S-1,phone,{PHONE}\n", "--replace", "--force")
    reappeared = Reappearance.objects.get()
    assert reappeared.consumer is None and reappeared.remote_identifier == "S-9"


def test_the_same_consumer_registered_again_is_not_counted_twice(
    broker: Broker, deleted: WorkItem, tmp_path: Path
) -> None:
    text = f"remote_identifier,hash_type,hash\nS-9,email,{ANNA}\n"
    import_file(tmp_path, text)
    import_file(tmp_path, text)  # nothing added: nothing matched

    assert Reappearance.objects.count() == 1


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("drop", "reappearances", "--broker", "4821", *args, stdout=out)
    return out.getvalue()


def test_the_command_counts_them_by_source_and_month(
    broker: Broker, deleted: WorkItem, tmp_path: Path
) -> None:
    sha256 = import_file(tmp_path, f"remote_identifier,hash_type,hash\nS-9,email,{ANNA}\n")
    # The month in DROP's calendar, as the command counts (in UTC it is the next month
    # for hours around each month's turn).
    month = f"{drop_date(Reappearance.objects.get().reappeared_at):%Y-%m}"

    summary = json.loads(run("--json"))

    assert summary["reappearances"] == 1
    assert summary["by_source_and_month"] == [
        {
            "month": month,
            "source": "file:supplier-a.csv",
            "source_sha256": sha256,
            "reappearances": 1,
            "work_items": 1,
        }
    ]
    assert "file:supplier-a.csv" in run() and sha256 in run()
    assert json.loads(run("--json", "--since", "2999-01-01"))["reappearances"] == 0
    assert "No reappearance" in run("--since", "2999-01-01")


def test_the_command_refuses_an_unknown_broker_or_date(broker: Broker) -> None:
    with pytest.raises(CommandError, match="no broker with id '9999'"):
        call_command("drop", "reappearances", "--broker", "9999")
    with pytest.raises(CommandError, match="not a date"):
        call_command("drop", "reappearances", "--broker", "4821", "--since", "yesterday")


def test_the_admin_lists_them_with_the_count_by_source_and_month(
    broker: Broker, deleted: WorkItem, tmp_path: Path, admin_client: Client
) -> None:
    import_file(tmp_path, f"remote_identifier,hash_type,hash\nS-9,email,{ANNA}\n")
    reappeared = Reappearance.objects.get()

    page = admin_client.get("/admin/integrations/reappearance/")
    detail = admin_client.get(f"/admin/integrations/reappearance/{reappeared.pk}/change/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "By source and month" in text and "file:supplier-a.csv" in text and "S-9" in text
    assert detail.status_code == 200 and reappeared.source_sha256 in detail.content.decode()
    filtered = admin_client.get(
        "/admin/integrations/reappearance/", {"broker__id__exact": str(broker.pk)}
    )
    assert "file:supplier-a.csv" in filtered.content.decode()
