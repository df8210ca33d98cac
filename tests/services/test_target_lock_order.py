"""Retiring or enabling an integration while one of its deliveries is in flight and is
answered 410 Gone: the delivery batch holds its request rows and then disables the
integration, so a staff action that held the integration and then waited for those rows
would deadlock with it. Both must end, neither refused by a deadlock.

This test commits (threads and a second connection must see the rows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections

from devtools.broker_simulator import BrokerSimulator, Reply
from integrations.models import Broker, DeletionRequest, Integration, RequestState
from integrations.services.dispatch.deliveries import deletion_requests_deliver
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    integration_retire,
)
from tests.builders import DeletionRequestFactory, webhook_integration_created

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _waiting_for_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def held_410() -> Iterator[tuple[BrokerSimulator, threading.Event, threading.Event]]:
    """A broker whose receiver answers 410 Gone, each answer held until ``release``."""
    arrived, release = threading.Event(), threading.Event()
    with BrokerSimulator(default_reply=Reply.gone()) as simulator:
        record = simulator._record

        def held(*args: Any, **kwargs: Any) -> Reply:
            reply = record(*args, **kwargs)
            arrived.set()
            release.wait(30)
            return reply

        simulator._record = held  # type: ignore[method-assign]
        yield simulator, arrived, release
        release.set()


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


def _race(
    request: DeletionRequest,
    arrived: threading.Event,
    release: threading.Event,
    staff_action: Callable[[], object],
) -> list[BaseException]:
    """Deliver ``request``; while its 410 is held, run ``staff_action`` until it waits for
    the request the batch holds; then let the 410 come back. The errors of either."""
    errors: list[BaseException] = []
    delivering = _in_thread(lambda: deletion_requests_deliver(request_ids=[request.pk]), errors)
    assert arrived.wait(30), "the delivery did not reach the broker"
    acting = _in_thread(staff_action, errors)
    _until(lambda: _waiting_for_locks() >= 1, "the staff action did not wait for the request")
    release.set()  # the 410 comes back: the batch disables the integration
    delivering.join(60)
    acting.join(60)
    assert not delivering.is_alive() and not acting.is_alive()
    return errors


def test_a_410_answered_while_its_integration_is_retired_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    simulator, arrived, release = held_410
    integration = webhook_integration_created(broker, simulator.url).integration
    request = DeletionRequestFactory.create(integration=integration, state=RequestState.QUEUED)

    errors = _race(
        request,
        arrived,
        release,
        lambda: integration_retire(integration=integration, reason="replaced", actor="test"),
    )

    assert errors == []
    integration = Integration.objects.get(pk=integration.pk)
    assert integration.retired_at is not None and not integration.enabled
    request = DeletionRequest.objects.get(pk=request.pk)
    assert request.state == RequestState.CANCELLED
    assert request.delivery_attempts.get().status == 410


def test_a_410_answered_while_its_integration_is_enabled_again_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    """Staff paused the integration while the batch was sending, and enable it again."""
    simulator, arrived, release = held_410
    integration = webhook_integration_created(broker, simulator.url).integration
    request = DeletionRequestFactory.create(integration=integration, state=RequestState.QUEUED)

    def pause_and_enable() -> None:
        integration_disable(integration=integration, reason="paused", actor="test")
        integration_enable(integration=integration, actor="test")

    errors = _race(request, arrived, release, pause_and_enable)

    assert errors == []
    # The 410 came after the pause: the integration stays as staff left it, enabled, and
    # the request is queued again at once.
    assert Integration.objects.get(pk=integration.pk).enabled
    request = DeletionRequest.objects.get(pk=request.pk)
    assert request.state == RequestState.QUEUED
    assert request.delivery_attempts.get().status == 410
