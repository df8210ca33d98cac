"""A resolution answer and the import of a Removed file that closes its work item, at once:
whichever takes the item first, no SaaS deletion is left to be sent for an identifier DROP
removed.

This test commits (the import runs in a thread, on its own connection).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from django.core.management import call_command

from devtools.drop_simulator import work_items
from integrations.models import (
    Broker,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle import drop_removed
from integrations.services.dispatch.resolutions import resolution_outcome_record
from integrations.services.staff.integrations import webhook_integration_create
from tests.builders import ConsumerFactory, SaasConnectionFactory, drop_zip, write_zip
from tests.conftest import in_thread, sessions_waiting_for_locks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ITEMS = list(work_items(1))


@pytest.fixture
def resolution(broker: Broker, tmp_path: Path, settings: Any) -> ResolutionRequest:
    """A match's identifier retrieval, out with the broker (the SaaS connection asks for it)."""
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    # Port 9 (discard): nothing here is delivered.
    webhook_integration_create(broker=broker, name="crm", url="http://127.0.0.1:9/crm", actor="t")
    SaasConnectionFactory.create(broker=broker, url="http://127.0.0.1:9/erase", name="Mailer")
    _import(broker, tmp_path, {"Email": ITEMS}, [], "20261120")
    request = ResolutionRequest.objects.get()
    ResolutionRequest.objects.filter(pk=request.pk).update(state=RequestState.DISPATCHED)
    return request


def _import(broker: Broker, tmp_path: Path, lists: Any, removed: Any, date: str) -> None:
    name = f"{date}_4821_DROP.zip"
    package = write_zip(tmp_path, drop_zip(broker, lists, removed, date=date), name=name)
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())


def _answer(resolution: ResolutionRequest) -> None:
    resolution_outcome_record(
        resolution_request=resolution,
        drop_outcome="",
        exemption_basis="",
        identifiers={"email": [{"email": "Ann@Example.com"}]},
        actor="t",
    )


class _PausedImport(NamedTuple):
    go: threading.Event  # set: the import goes on
    thread: threading.Thread
    errors: list[BaseException]  # what either side raised, for the test to report


@pytest.fixture
def removal_paused(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[bool], _PausedImport]]:
    """``pause(after)``: DROP's next package removes the item (the consumer cancelled); its
    import, in a thread, stops just before (or after) it locks the items it closes, and
    waits there until the test lets it go."""
    original = drop_removed.work_items_lock
    paused, go = threading.Event(), threading.Event()

    def pause(after: bool) -> _PausedImport:
        def lock(*args: Any, **kwargs: Any) -> None:
            if after:
                original(*args, **kwargs)
            paused.set()
            assert go.wait(30), "the test never let the import go"
            if not after:
                original(*args, **kwargs)

        monkeypatch.setattr(drop_removed, "work_items_lock", lock)
        errors: list[BaseException] = []
        removed = [(ITEMS[0][0], ITEMS[0][1], "Email")]
        thread = in_thread(
            lambda: _import(broker, tmp_path, {"Email": []}, removed, "20270104"), errors
        )
        assert paused.wait(30), "the import did not reach the items' lock"
        return _PausedImport(go, thread, errors)

    yield pause
    go.set()


def _nothing_left_to_send() -> None:
    assert WorkItem.objects.get().state == WorkItemState.REMOVED
    assert not SaasDeletion.objects.exclude(state=RequestState.CANCELLED).exists()


def test_an_answer_that_took_the_item_first_has_its_saas_deletions_cancelled(
    resolution: ResolutionRequest, removal_paused: Any
) -> None:
    importing = removal_paused(False)  # its requests cancelled, the items not yet locked

    _answer(resolution)  # the item still open: a deletion is started
    assert SaasDeletion.objects.get().state == RequestState.QUEUED

    importing.go.set()
    importing.thread.join(30)
    assert not importing.errors, importing.errors
    _nothing_left_to_send()
    assert SaasDeletion.objects.get().last_error == "work item removed by DROP (consumer cancelled)"


def test_an_answer_while_the_import_holds_the_item_waits_and_starts_nothing(
    resolution: ResolutionRequest, removal_paused: Any
) -> None:
    importing = removal_paused(True)  # the items locked, the removal not yet committed

    answering = in_thread(lambda: _answer(resolution), importing.errors)
    wait_until(lambda: sessions_waiting_for_locks() >= 1, "the answer did not wait for the item")
    importing.go.set()
    importing.thread.join(30)
    answering.join(30)

    assert not importing.errors, importing.errors
    _nothing_left_to_send()
    assert not SaasDeletion.objects.exists()
    resolution.refresh_from_db()
    assert (resolution.state, resolution.identifiers) == (RequestState.COMPLETED, "")
    event = LedgerEvent.objects.get(kind="resolution_request.outcome_recorded")
    assert event.data["work_item_removed"] is True
    assert event.data["saas_deletions"] == []
