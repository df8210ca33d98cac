"""A broker's consumer import beside the DROP import that matches the same broker."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from devtools.drop_simulator import work_items
from integrations.models import Broker, DeletionRequest
from integrations.services.cycle import drop_import
from integrations.services.cycle.drop_import import drop_zip_import
from tests.builders import drop_zip, write_zip
from tests.conftest import sessions_waiting_for_locks, wait_until

ITEMS = list(work_items(4))


@pytest.mark.django_db(transaction=True)
def test_a_first_import_waits_for_a_drop_import_that_holds_the_matching_lock(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DROP import holds the broker's matching lock and has not read the consumer hashes
    yet; the broker's first consumer import, whose partition is new, must wait for it
    rather than deadlock with it."""
    locked, release = threading.Event(), threading.Event()
    original = drop_import.staged_items_set_aside_received

    def hold_after_lock(**kwargs: Any) -> Any:
        locked.set()
        release.wait(timeout=30)
        return original(**kwargs)

    monkeypatch.setattr(drop_import, "staged_items_set_aside_received", hold_after_lock)
    package = write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS}))
    failures: list[BaseException] = []

    def run_drop_import() -> None:
        try:
            drop_zip_import(broker=broker, path=package, actor="test")
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            connections.close_all()

    importer = threading.Thread(target=run_drop_import)
    importer.start()
    assert locked.wait(timeout=30)

    def release_once_waiting() -> None:
        wait_until(lambda: sessions_waiting_for_locks() > 0, "the consumer import waits")
        release.set()
        connections.close_all()

    releaser = threading.Thread(target=release_once_waiting)
    releaser.start()
    csv = tmp_path / "consumers.csv"
    csv.write_text(
        "remote_identifier,hash_type,hash\r\n"
        + "".join(f"C-{n},email,{hash_}\r\n" for n, (_, hash_) in enumerate(ITEMS[:2]))
    )
    try:
        call_command("consumers", "import", "--broker", "4821", "--hashed", str(csv))
    finally:
        release.set()
        releaser.join()
        importer.join()
    assert not failures
    assert DeletionRequest.objects.count() == 2
