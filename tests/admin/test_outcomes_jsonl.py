"""The outcome history as JSONL from the request list, for auditors (beside the CSV)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from integrations.models import Broker, DeletionRequest, LedgerEvent
from integrations.selectors.outcomes import OUTCOME_COLUMNS
from tests.builders import sample_cycle

pytestmark = pytest.mark.django_db


def test_an_auditor_exports_the_selected_requests_as_jsonl(broker: Broker, client: Client) -> None:
    world = sample_cycle(broker, today=timezone.localdate())
    auditor = User.objects.create_user("ada", password="pw-ada-123", is_staff=True)
    auditor.groups.add(Group.objects.get(name="Auditors"))
    client.force_login(auditor)
    chosen = [world.requests["failed"], world.requests["completed"]]

    response = client.post(
        "/admin/integrations/deletionrequest/",
        {"action": "export_outcomes_jsonl", "_selected_action": [r.pk for r in chosen]},
    )

    assert response["Content-Type"] == "application/x-ndjson"
    rows = [json.loads(line) for line in response.getvalue().decode().splitlines()]
    assert {row["request_uuid"] for row in rows} == {str(r.request_uuid) for r in chosen}
    assert all(list(row) == list(OUTCOME_COLUMNS) for row in rows)
    assert {row["state"] for row in rows} == {"failed", "completed"}
    event = LedgerEvent.objects.get(kind="outcomes.exported")
    assert (event.actor, event.data["format"]) == ("staff:ada", "jsonl")
    assert DeletionRequest.objects.filter(state="failed").count() == 1  # nothing changed
