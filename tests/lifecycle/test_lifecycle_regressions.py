"""Histories the model-based test (``test_lifecycle_model.py``) shrank to a failure, each kept
as a plain test of the public surfaces."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from devtools.drop_simulator import work_items
from integrations.models import Broker, DeletionRequest, RequestState
from integrations.selectors.stuck import StuckReason, stuck_work_items
from integrations.services.staff.integrations import webhook_integration_create
from integrations.services.staff.keys import CreatedApiKey
from tests.builders import drop_zip, write_zip
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


def _doctor() -> tuple[int, dict[str, object]]:
    out = io.StringIO()
    try:
        call_command("drop", "doctor", "--json", stdout=out)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, json.loads(out.getvalue())


def test_a_consumer_matched_late_while_no_target_exists_is_listed_by_drop_doctor(
    broker: Broker,
    make_key: Callable[..., CreatedApiKey],
    api_client: APIClient,
    tmp_path: Path,
) -> None:
    # Shrunk: import a package nobody matches, then register its consumer; the late match
    # has no target, so its request waits, and only staff can give it one.
    ((work_item_id, email_hash),) = list(work_items(1))
    package = write_zip(tmp_path, drop_zip(broker, {"Email": [(work_item_id, email_hash)]}))
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())
    answer = api_client.post(
        "/api/v1/drop/consumers",
        {"consumers": [{"remote_identifier": "C-0", "hashes": {"email": [email_hash]}}]},
        format="json",
        **bearer(make_key("ingest").key),
    )
    assert answer.status_code in (200, 201), answer.content
    assert DeletionRequest.objects.get().state == RequestState.PENDING

    code, report = _doctor()

    assert code == 1
    assert report["work_items"] == 1
    groups = report["groups"]
    assert isinstance(groups, list)
    (group,) = groups
    assert (group["reason"], group["work_items"]) == ("pending_without_target", 1)
    # Asked for some reasons only (as the model's invariant asks), the doctor gives the same
    # groups of those, and none of the others.
    every = stuck_work_items(broker=broker)
    assert stuck_work_items(broker=broker, reasons=[StuckReason.PENDING_WITHOUT_TARGET]) == every
    others = set(StuckReason) - {StuckReason.PENDING_WITHOUT_TARGET}
    assert stuck_work_items(broker=broker, reasons=others) == []

    # A target arrives: the request is queued and the item has a live path again.
    webhook_integration_create(
        broker=broker, name="CRM", url="https://crm.acme.example/drop", actor="staff:ann"
    )
    assert DeletionRequest.objects.get().state == RequestState.QUEUED
    assert _doctor() == (
        0,
        {
            "stuck": False,
            "work_items": 0,
            "groups": [],
            "drop_access_obligations": [],
            "directives_not_acknowledged": [],
        },
    )
