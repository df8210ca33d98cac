"""A broker's consumer import beside the DROP import that matches the same broker."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from devtools.drop_simulator import work_items
from integrations.models import Broker, Consumer, DeletionRequest
from integrations.services.cycle import drop_import
from integrations.services.cycle.consumers import consumer_forget
from integrations.services.cycle.drop_import import drop_zip_import
from tests.builders import ConsumerFactory, drop_zip, write_zip
from tests.conftest import in_thread, sessions_waiting_for_locks, wait_until

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


def _drop_import_held_after_its_match(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    """A DROP import of ``ITEMS`` started in a thread, held once it has matched the
    consumer hashes (under the matching lock) until the event returned is set."""
    matched, release = threading.Event(), threading.Event()
    original = drop_import.staged_items_match

    def match_then_hold(**kwargs: Any) -> int:
        count = original(**kwargs)
        matched.set()
        release.wait(timeout=30)
        return count

    monkeypatch.setattr(drop_import, "staged_items_match", match_then_hold)
    package = write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS}))
    failures: list[BaseException] = []

    def run_drop_import() -> None:
        try:
            drop_zip_import(broker=broker, path=package, actor="test")
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            release.set()
            connections.close_all()

    importer = threading.Thread(target=run_drop_import)
    importer.start()
    assert matched.wait(timeout=30)
    return importer, release, failures


def _in_thread(work: Any) -> tuple[threading.Thread, list[BaseException]]:
    failures: list[BaseException] = []
    return in_thread(work, failures), failures


@pytest.mark.django_db(transaction=True)
def test_a_consumer_forgotten_while_a_drop_import_matches_it_waits_for_the_import(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import matched C-1 and will name it in its requests; forgetting C-1 meanwhile
    must wait for the import (the matching lock), not make its commit fail."""
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    importer, release, import_failures = _drop_import_held_after_its_match(
        broker, tmp_path, monkeypatch
    )
    forget, forget_failures = _in_thread(
        lambda: consumer_forget(broker=broker, remote_identifier="C-1", actor="test")
    )
    wait_until(
        lambda: not forget.is_alive() or sessions_waiting_for_locks() > 0,
        "the forget ends or waits",
    )
    release.set()
    importer.join()
    forget.join()
    assert not import_failures and not forget_failures
    request = DeletionRequest.objects.get()
    assert (request.remote_identifier, request.consumer_id) == ("C-1", None)
    assert not Consumer.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("adds", [False, True], ids=["forgets only", "forgets and adds"])
def test_a_replace_forgetting_a_consumer_a_drop_import_matched_waits_for_the_import(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adds: bool
) -> None:
    """The import matched C-1; a replace whose file no longer lists C-1 must wait for the
    import before forgetting it: not lose the import's match, nor deadlock with it when the
    replace, having added hashes, waits for the matching lock to match them late."""
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    ConsumerFactory.create(broker=broker, remote_identifier="C-2", hashes={"email": ITEMS[1][1]})
    importer, release, import_failures = _drop_import_held_after_its_match(
        broker, tmp_path, monkeypatch
    )
    csv = tmp_path / "consumers.csv"
    rows = [f"C-2,email,{ITEMS[1][1]}"] + ([f"C-3,email,{ITEMS[2][1]}"] if adds else [])
    csv.write_text("remote_identifier,hash_type,hash\r\n" + "".join(f"{r}\r\n" for r in rows))
    replace, replace_failures = _in_thread(
        lambda: call_command(
            "consumers", "import", "--broker", "4821", "--hashed", "--replace", "--force", str(csv)
        )
    )
    wait_until(
        lambda: not replace.is_alive() or sessions_waiting_for_locks() > 0,
        "the replace ends or waits",
    )
    release.set()
    importer.join()
    replace.join()
    assert not import_failures and not replace_failures
    requests = dict(DeletionRequest.objects.values_list("remote_identifier", "consumer_id"))
    assert requests.keys() == {"C-1", "C-2", *(["C-3"] if adds else [])}
    assert requests["C-1"] is None  # forgotten: the request keeps its copy of the pointer
    assert set(Consumer.objects.values_list("remote_identifier", flat=True)) == {
        "C-2",
        *(["C-3"] if adds else []),
    }
