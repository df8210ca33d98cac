"""A pull queued by DROP's ``download.ready``, run by a real worker (its own connection, as
``manage.py worker``): its deliveries are queued in the import's transaction, so they leave
as promptly as a pull by hand's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from procrastinate.contrib.django.models import ProcrastinateJob
from procrastinate.contrib.django.utils import connector_params
from rest_framework.test import APIClient

from devtools.drop_simulator import DropSimulator, build_drop_zip, work_items
from integrations import enqueue
from integrations.models import Broker, DeletionRequest
from integrations.services.cycle import drop as drop_services
from integrations.services.cycle import drop_import
from integrations.services.staff.brokers import broker_drop_webhook_secret_set, broker_update
from tests.builders import (
    DROP_WEBHOOK_SECRET,
    ConsumerFactory,
    WebhookIntegrationFactory,
    drop_notification_post,
    run_worker,
)

pytestmark = pytest.mark.django_db(transaction=True)

DROP_KEY = "dk_test_notifiedPull_7"
(ITEM,) = work_items(1)


@pytest.fixture
def drop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: Any) -> Iterator[DropSimulator]:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    monkeypatch.setattr(drop_services, "wait", lambda seconds: None)
    monkeypatch.setattr(drop_services, "PACKAGES_DIR", tmp_path / "packages")
    with DropSimulator(api_key=DROP_KEY, broker_id="4821") as simulator:
        yield simulator


def _delivery_jobs_seen_by_another_connection() -> int:
    """What the dispatch worker, on its own connection, could fetch now."""
    with psycopg.connect(**connector_params("default")) as other:
        row = other.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE task_name = %s",
            [enqueue.DELIVER_DELETION_REQUESTS],
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_notified_pulls_deliveries_commit_with_its_requests(
    broker: Broker, drop: DropSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker_update(broker=broker, actor="test", drop_api_key=DROP_KEY, drop_base_url=drop.url)
    broker_drop_webhook_secret_set(broker=broker, secret=DROP_WEBHOOK_SECRET, actor="test")
    WebhookIntegrationFactory.create(broker=broker)
    ConsumerFactory.create(broker=broker, remote_identifier="C-A", hashes={"email": ITEM[1]})
    drop.queue_package(build_drop_zip("4821", "20260312", {"Email": [ITEM]}))

    seen_before_commit: list[int] = []
    create = drop_import.requests_create_for_matches

    def create_and_look(**kwargs: Any) -> Any:
        created = create(**kwargs)
        # Still inside the import's transaction: its requests are not committed yet.
        seen_before_commit.append(_delivery_jobs_seen_by_another_connection())
        return created

    monkeypatch.setattr(drop_import, "requests_create_for_matches", create_and_look)
    assert drop_notification_post(APIClient(), "download.ready").status_code == 204

    run_worker(["drop"])

    (request,) = DeletionRequest.objects.all()
    # No delivery job a dispatch worker could run before the requests it names exist (it
    # would find nothing due and end, leaving them queued with no job).
    assert seen_before_commit == [0]
    (job,) = ProcrastinateJob.objects.filter(task_name=enqueue.DELIVER_DELETION_REQUESTS)
    assert job.status == "todo"
    assert job.args == {"request_ids": [request.pk]}
