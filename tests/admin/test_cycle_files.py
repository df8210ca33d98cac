"""A cycle's response files as one ZIP: the exact bytes DROP got, and a manifest to check them."""

from __future__ import annotations

import csv
import hashlib
import io
import zipfile

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from integrations.models import Broker, LedgerEvent, ReportFile
from tests.builders import SampleCycle, sample_cycle

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(broker: Broker) -> SampleCycle:
    return sample_cycle(broker, today=timezone.localdate())


def member_of(group: str, client: Client) -> Client:
    user = User.objects.create_user(group.split()[0].lower(), password="pw-role-123", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    client.force_login(user)
    return client


def test_an_auditor_downloads_a_cycles_response_files_with_their_manifest(
    world: SampleCycle, client: Client
) -> None:
    auditor = member_of("Auditors", client)
    page = auditor.get(f"/admin/integrations/dropcycle/{world.previous.pk}/change/")
    url = f"/admin/integrations/dropcycle/{world.previous.pk}/response-files.zip"
    assert f'<form method="post" action="{url}"' in page.content.decode()
    assert auditor.get(url).status_code == 405  # it writes a ledger event: POST only
    assert not LedgerEvent.objects.filter(kind="report_files.exported").exists()

    response = auditor.post(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert "4821_cycle1_response_files.zip" in response["Content-Disposition"]
    archive = zipfile.ZipFile(io.BytesIO(response.getvalue()))
    stored = ReportFile.objects.get(cycle=world.previous)
    assert sorted(archive.namelist()) == sorted(["MANIFEST.csv", stored.file_name])
    assert archive.read(stored.file_name) == bytes(stored.content)
    (entry,) = csv.DictReader(io.StringIO(archive.read("MANIFEST.csv").decode()))
    assert entry["sha256"] == stored.sha256
    assert entry["state"] == "accepted"
    assert stored.uploaded_at is not None
    assert entry["uploaded_at"] == stored.uploaded_at.isoformat()

    event = LedgerEvent.objects.get(kind="report_files.exported")
    assert (event.actor, event.subject, event.data["files"]) == ("staff:auditors", "cycle 1", 1)


def test_the_zip_needs_the_permission_to_view_report_files(
    world: SampleCycle, client: Client
) -> None:
    manager = member_of("Connections managers", client)
    url = f"/admin/integrations/dropcycle/{world.cycle.pk}/response-files.zip"
    assert manager.post(url).status_code == 403
    assert not LedgerEvent.objects.filter(kind="report_files.exported").exists()


def test_an_unknown_cycle_is_not_found(world: SampleCycle, client: Client) -> None:
    auditor = member_of("Auditors", client)
    assert (
        auditor.post("/admin/integrations/dropcycle/999999/response-files.zip").status_code == 404
    )


def test_the_manifest_sha256_is_the_digest_of_the_file(world: SampleCycle, client: Client) -> None:
    content = b"Id,Status\r\nWI0000000001,3\r\n"
    ReportFile.objects.filter(cycle=world.cycle).update(
        content=content, sha256=hashlib.sha256(content).hexdigest()
    )
    auditor = member_of("Auditors", client)
    response = auditor.post(f"/admin/integrations/dropcycle/{world.cycle.pk}/response-files.zip")
    archive = zipfile.ZipFile(io.BytesIO(response.getvalue()))
    (entry,) = csv.DictReader(io.StringIO(archive.read("MANIFEST.csv").decode()))
    assert hashlib.sha256(archive.read(entry["file_name"])).hexdigest() == entry["sha256"]
