"""The migration masking again: the free text kept before the masking, or before its rules
of today, is masked as the services mask it now, each row's own UUIDs kept; the rest is not
written."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from integrations.dispatch.masking import free_text_masked
from integrations.models import (
    DeletionRequest,
    DeliveryAttempt,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
)
from tests.builders import (
    DeletionRequestFactory,
    DeliveryAttemptFactory,
    IsiConnectionFactory,
    ResolutionRequestFactory,
)
from tests.dispatch.test_free_text_masking import REQUEST_UUID, TRICKY

GAID = "38400000-8cf0-11bd-b23e-10b96e40000d"  # Google's advertising ID, written as ours are
URL = "https://crm.example/drop"


def _migration() -> ModuleType:
    (path,) = (Path(settings.BASE_DIR) / "integrations" / "migrations").glob("0068_*.py")
    return importlib.import_module(f"integrations.migrations.{path.stem}")


def _migrate(migration: ModuleType) -> None:
    """The migration's step, run with the models as they are at it."""
    name = migration.__name__.rsplit(".", 1)[1]
    apps = MigrationLoader(connection).project_state(("integrations", name)).apps
    migration.free_text_masked_again(apps, None)


def _ctid(row: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT ctid FROM {row._meta.db_table} WHERE id = %s", [row.pk])  # noqa: S608
        return str(cursor.fetchone()[0])


@pytest.fixture
def migration(db: None, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = _migration()
    monkeypatch.setattr(module, "BATCH", 2)  # several batches of a few rows
    return module


def test_the_text_kept_in_clear_is_masked_each_rows_own_uuids_kept(
    migration: ModuleType,
) -> None:
    deletion = DeletionRequestFactory.create(failed=True)
    # As kept before the masking: written straight to the columns.
    DeletionRequest.objects.filter(pk=deletion.pk).update(
        error_message=f"request {deletion.request_uuid}: cannot delete ann@example.com ({GAID})",
        last_error="500: no client for bob\u200b@example.com",
    )
    resolution = ResolutionRequestFactory.create(saas_deletions=["queued"])
    ResolutionRequest.objects.filter(pk=resolution.pk).update(
        exemption_basis="legal_hold for ann＠example.com, born 4th of July 1985",
        last_error="500: call 415 - 555 - 1234",
    )
    saas = resolution.saas_deletions.get()
    SaasDeletion.objects.filter(pk=saas.pk).update(last_error="400: July 4th, 1985 unknown")
    attempts = [
        DeliveryAttemptFactory.create(
            deletion_request=deletion,
            url=URL,
            response_body=f"{deletion.webhook_request_id} {deletion.request_uuid} 415/555/1234",
            error="",
        ),
        DeliveryAttemptFactory.create(
            resolution_request=resolution, url=URL, response_body=f"{resolution.request_uuid}"
        ),
        DeliveryAttemptFactory.create(
            saas_deletion=saas,
            url=URL,
            response_body=f"{resolution.request_uuid} {GAID}",
            error="oauth: no client for ann@example.com",
        ),
    ]

    _migrate(migration)

    deletion.refresh_from_db()
    assert (
        deletion.error_message == f"request {deletion.request_uuid}: cannot delete <email> (<maid>)"
    )
    assert deletion.last_error == "500: no client for <email>"
    resolution.refresh_from_db()
    assert resolution.exemption_basis == "legal_hold for <email>, born <date>"
    assert resolution.last_error == "500: call <number>"
    saas.refresh_from_db()
    assert saas.last_error == "400: <date> unknown"
    kept = {a.pk: (a.response_body, a.error) for a in DeliveryAttempt.objects.all()}
    assert kept == {
        attempts[0].pk: (f"{deletion.webhook_request_id} {deletion.request_uuid} <number>", ""),
        attempts[1].pk: (f"{resolution.request_uuid}", ""),
        attempts[2].pk: (f"{resolution.request_uuid} <maid>", "oauth: no client for <email>"),
    }


def test_a_row_whose_text_masking_leaves_as_it_is_is_not_written(migration: ModuleType) -> None:
    masked = DeletionRequestFactory.create(failed=True)
    DeletionRequest.objects.filter(pk=masked.pk).update(error_message="CRM says <email> is locked")
    clear = DeletionRequestFactory.create(failed=True)
    DeletionRequest.objects.filter(pk=clear.pk).update(error_message="locked: ann@example.com")
    plain = DeletionRequestFactory.create(failed=True)  # "CRM timeout"
    before = {row.pk: _ctid(row) for row in (masked, clear, plain)}

    _migrate(migration)

    # A row updated gets a new row version (ctid); one not written keeps its own.
    assert {row.pk: _ctid(row) == before[row.pk] for row in (masked, clear, plain)} == {
        masked.pk: True,
        clear.pk: False,
        plain.pk: True,
    }
    again = {row.pk: _ctid(row) for row in (masked, clear, plain)}
    _migrate(migration)  # run again (stopped midway, say): masked text masks to itself
    assert {row.pk: _ctid(row) for row in (masked, clear, plain)} == again


def test_a_masked_text_is_cut_to_its_columns_length(migration: ModuleType) -> None:
    resolution = ResolutionRequestFactory.create()
    basis = "x" * 96 + " a@b"  # 100 characters, masked to 104
    ResolutionRequest.objects.filter(pk=resolution.pk).update(exemption_basis=basis)

    _migrate(migration)

    resolution.refresh_from_db()
    assert resolution.exemption_basis == ("x" * 96 + " <email>")[:100]


@pytest.mark.parametrize("sent", TRICKY)
def test_the_frozen_masker_masks_as_the_services_do(sent: str) -> None:
    migration = _migration()
    own = [REQUEST_UUID]

    frozen = migration.free_text_masked(sent, limit=2000, own_uuids=own)

    assert frozen == free_text_masked(sent, limit=2000, own_uuids=own)
    assert migration.free_text_masked(frozen, limit=2000, own_uuids=own) == frozen


def test_a_cancelled_rows_reason_is_left_as_staff_or_the_service_wrote_it(
    migration: ModuleType,
) -> None:
    reason = "target retired: contract ended 2026-11-30, ticket 20261130001"
    cancelled = DeletionRequestFactory.create(state=RequestState.CANCELLED, last_error=reason)
    failing = DeletionRequestFactory.create(
        state=RequestState.QUEUED, last_error="500: ticket 20261130001 for ann@example.com"
    )
    resolution = ResolutionRequestFactory.create(
        state=RequestState.CANCELLED, last_error=reason, saas_deletions=["cancelled"]
    )
    saas = resolution.saas_deletions.get()
    SaasDeletion.objects.filter(pk=saas.pk).update(last_error=reason)

    _migrate(migration)

    cancelled.refresh_from_db()
    failing.refresh_from_db()
    resolution.refresh_from_db()
    saas.refresh_from_db()
    assert (cancelled.last_error, resolution.last_error, saas.last_error) == (reason,) * 3
    assert failing.last_error == "500: ticket <number> for <email>"


def test_an_isi_rows_connection_uuid_is_kept_as_its_own(migration: ModuleType) -> None:
    connection_ = IsiConnectionFactory.create()
    request = DeletionRequestFactory.create(isi_connection=connection_)
    text = f"404 from /connections/{connection_.uuid}/delete, device {GAID}"
    DeletionRequest.objects.filter(pk=request.pk).update(last_error=text)
    attempt = DeliveryAttemptFactory.create(deletion_request=request, url=URL, error=text)

    _migrate(migration)

    request.refresh_from_db()
    attempt.refresh_from_db()
    kept = f"404 from /connections/{connection_.uuid}/delete, device <maid>"
    assert (request.last_error, attempt.error) == (kept, kept)
