"""The continuing duty against what runs beside it, on two real connections: a recurring
round (or a canary round) inserting requests while staff forget a consumer or retire a
target. Each side must end, and what it leaves must hold: a forgotten consumer is pointed at
by no request, a retired target gets no request.

These tests commit (threads and a second connection must see the rows).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from integrations.models import (
    Broker,
    DeletionRequest,
    Integration,
    RequestState,
)
from integrations.services.cycle import canaries
from integrations.services.cycle.canaries import canary_add, canary_round_send
from integrations.services.staff.integrations import (
    integration_retire,
    webhook_integration_create,
)
from tests.builders import ConsumerFactory
from tests.conftest import sessions_waiting_for_locks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _target(broker: Broker, name: str = "CRM") -> Integration:
    # Port 9 (discard): nothing here delivers.
    return webhook_integration_create(
        broker=broker, name=name, url=f"http://127.0.0.1:9/{name}", actor="test"
    ).integration


def _in_thread(work: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test, in its own thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _held_after(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str
) -> tuple[threading.Event, threading.Event]:
    """``module.name`` runs, then waits for ``release`` (``reached`` once it ran): its
    transaction has written its requests and not committed."""
    reached, release = threading.Event(), threading.Event()
    real = getattr(module, name)

    def held(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        reached.set()
        release.wait(30)
        return result

    monkeypatch.setattr(module, name, held)
    return reached, release


def _side_ends_or_waits(thread: threading.Thread) -> None:
    wait_until(
        lambda: not thread.is_alive() or sessions_waiting_for_locks() >= 1,
        "the other side neither ended nor waited for a lock",
    )


def test_a_target_retired_while_a_canary_round_is_sent_gets_no_request_left_waiting(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``drop canary`` has inserted its requests and not committed when staff retire a
    target: the retirement must either come first (no request for it) or cancel the
    round's request, never leave one queued for a target that will never be enabled."""
    kept = _target(broker, "CRM")
    retired = _target(broker, "Warehouse")
    ConsumerFactory.create(broker=broker, remote_identifier="TEST-0001", hashes={"email": "AAAA"})
    canary_add(broker=broker, remote_identifier="TEST-0001", actor="test")
    reached, release = _held_after(monkeypatch, canaries, "canary_requests_create")
    errors: list[BaseException] = []

    sending = _in_thread(lambda: canary_round_send(broker=broker, actor="test"), errors)
    assert reached.wait(30), "the canary round did not insert its requests"
    retiring = _in_thread(
        lambda: integration_retire(integration=retired, reason="replaced", actor="test"),
        errors,
    )
    _side_ends_or_waits(retiring)
    release.set()
    sending.join(60)
    retiring.join(60)

    assert not sending.is_alive() and not retiring.is_alive()
    assert errors == []
    assert Integration.objects.get(pk=retired.pk).retired_at is not None
    assert not DeletionRequest.objects.filter(
        integration=retired, canary_round__isnull=False, state=RequestState.QUEUED
    ).exists()
    assert DeletionRequest.objects.filter(integration=kept, state=RequestState.QUEUED).count() == 1
