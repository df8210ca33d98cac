"""The admin's evidence page: Auditors export a signed pack (a POST, a ledger event)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from devtools.drop_simulator import DropSimulator
from integrations.evidence.pack import load_public_key, public_key_pem
from integrations.evidence.verify import verify_pack
from integrations.models import Broker, DropCycle, LedgerEvent
from tests.evidence_world import DROP_KEY, evidence_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path) -> Iterator[DropCycle]:
    with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
        yield evidence_world(broker, drop, tmp_path)


def login(client: Client, *groups: str) -> None:
    user = User.objects.create_user("audrey", password="pw", is_staff=True)
    user.groups.add(*Group.objects.filter(name__in=groups))
    client.force_login(user)


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_an_auditor_exports_a_pack_that_verifies(
    cycle: DropCycle, client: Client, tmp_path: Path
) -> None:
    login(client, "Auditors")
    assert b'href="/admin/evidence/"' in client.get("/admin/").content
    page = client.get("/admin/evidence/")
    assert page.status_code == 200
    key_pem = page.context["public_key"]
    assert key_pem.startswith("-----BEGIN PUBLIC KEY-----")

    response = client.post("/admin/evidence/", {"broker": "4821", "cycle": "1"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    path = tmp_path / "from-admin.zip"
    path.write_bytes(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    result = verify_pack(path, public_key_pem=key_pem.encode())
    assert result.ok, result.failure
    event = LedgerEvent.objects.get(kind="evidence.exported")
    assert event.actor == "staff:audrey" and event.data["via"] == "admin"
    assert event.data["period"] == {"cycle": "1", "downloaded_at": cycle.downloaded_at.isoformat()}
    assert public_key_pem(load_public_key(key_pem)) == key_pem


def test_a_bad_request_shows_why_and_exports_nothing(cycle: DropCycle, client: Client) -> None:
    login(client, "Auditors")
    response = client.post("/admin/evidence/", {"broker": "4821", "cycle": "9"})
    assert response.status_code == 200
    assert "has no cycle &#x27;9&#x27;" in response.content.decode()
    assert not LedgerEvent.objects.filter(kind="evidence.exported").exists()


def test_staff_without_the_auditors_views_are_refused(cycle: DropCycle, client: Client) -> None:
    login(client)
    assert client.get("/admin/evidence/").status_code == 403
    assert client.post("/admin/evidence/", {"broker": "4821", "cycle": "1"}).status_code == 403
    assert not LedgerEvent.objects.filter(kind="evidence.exported").exists()


def test_a_period_is_of_drop_days_as_the_command_reads_it(cycle: DropCycle, client: Client) -> None:
    login(client, "Auditors")
    response = client.post(
        "/admin/evidence/", {"broker": "4821", "since": "2026-07-01", "until": "2026-07-01"}
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    event = LedgerEvent.objects.get(kind="evidence.exported")
    # July 1 in California: from 07:00 UTC on July 1 to 07:00 UTC on July 2.
    assert event.data["period"] == {
        "since": "2026-07-01T07:00:00+00:00",
        "until": "2026-07-02T07:00:00+00:00",
    }


@pytest.mark.parametrize(
    ("since", "until"), [("2026-01-01", "9999-12-31"), ("9999-12-30", "9999-12-31")]
)
def test_a_period_past_the_last_day_it_can_end_is_a_form_error(
    cycle: DropCycle, client: Client, since: str, until: str
) -> None:
    # The day after 9999-12-31, where that period would end, is past the dates Python holds.
    login(client, "Auditors")
    response = client.post("/admin/evidence/", {"broker": "4821", "since": since, "until": until})
    assert response.status_code == 200  # the form again, saying why
    assert "give a date in the years 2000 to 9998" in response.content.decode()
    assert not LedgerEvent.objects.filter(kind="evidence.exported").exists()


def test_the_form_takes_a_sample_and_its_seed(cycle: DropCycle, client: Client) -> None:
    login(client, "Auditors")
    response = client.post(
        "/admin/evidence/", {"broker": "4821", "cycle": "1", "sample": "2", "seed": "audit"}
    )
    assert response["Content-Type"] == "application/zip"
    event = LedgerEvent.objects.get(kind="evidence.exported")
    assert event.data["sample"] == {"seed": "audit", "size": 2, "drawn": 2}

    response = client.post("/admin/evidence/", {"broker": "4821", "cycle": "1", "sample": "2"})
    assert "give a sample size and a seed together" in response.content.decode()
    assert LedgerEvent.objects.filter(kind="evidence.exported").count() == 1


@pytest.mark.parametrize("size", ["10001", "99999999999999999999"])  # the last past a bigint
def test_a_sample_size_past_the_most_is_a_form_error(
    cycle: DropCycle, client: Client, size: str
) -> None:
    login(client, "Auditors")
    response = client.post(
        "/admin/evidence/", {"broker": "4821", "cycle": "1", "sample": size, "seed": "audit"}
    )
    assert response.status_code == 200  # the form again, saying why
    assert "Ensure this value is less than or equal to 10000." in response.content.decode()
    assert not LedgerEvent.objects.filter(kind="evidence.exported").exists()

    response = client.post(
        "/admin/evidence/", {"broker": "4821", "cycle": "1", "sample": "10000", "seed": "audit"}
    )
    assert response["Content-Type"] == "application/zip"
    event = LedgerEvent.objects.get(kind="evidence.exported")
    assert event.data["sample"] == {"seed": "audit", "size": 10000, "drawn": 8}
