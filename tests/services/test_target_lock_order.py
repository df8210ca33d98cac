"""Retiring or enabling an integration (or a SaaS connection) while one of its deliveries
is in flight and is answered 410 Gone: the delivery batch holds its rows and then disables
their target, so a staff action that held the target and then waited for those rows would
deadlock with it. Both must end, neither refused by a deadlock.

This test commits (threads and a second connection must see the rows).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections

from devtools.broker_simulator import BrokerSimulator, Reply
from integrations.models import (
    Broker,
    DeletionRequest,
    Integration,
    RequestState,
    SaasConnection,
    SaasDeletion,
)
from integrations.services.dispatch.deliveries import (
    deletion_requests_deliver,
    saas_deletions_deliver,
)
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    integration_retire,
)
from integrations.services.staff.saas import (
    saas_connection_disable,
    saas_connection_enable,
    saas_connection_retire,
)
from tests.builders import (
    DeletionRequestFactory,
    ResolutionRequestFactory,
    SaasConnectionFactory,
    SaasDeletionFactory,
    webhook_integration_created,
)

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
    deliver: Callable[[], object],
    arrived: threading.Event,
    release: threading.Event,
    staff_action: Callable[[], object],
) -> list[BaseException]:
    """``deliver``; while its 410 is held, run ``staff_action`` until it waits for the row
    the batch holds; then let the 410 come back. The errors of either."""
    errors: list[BaseException] = []
    delivering = _in_thread(deliver, errors)
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
        lambda: deletion_requests_deliver(request_ids=[request.pk]),
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

    errors = _race(
        lambda: deletion_requests_deliver(request_ids=[request.pk]),
        arrived,
        release,
        pause_and_enable,
    )

    assert errors == []
    # The 410 came after the pause: the integration stays as staff left it, enabled, and
    # the request is queued again at once.
    assert Integration.objects.get(pk=integration.pk).enabled
    request = DeletionRequest.objects.get(pk=request.pk)
    assert request.state == RequestState.QUEUED
    assert request.delivery_attempts.get().status == 410


def _saas_deletion(broker: Broker, url: str) -> SaasDeletion:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    resolution = ResolutionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        identifiers=json.dumps({"email": [{"email": "ann@example.com"}]}),
    )
    mailer = SaasConnectionFactory.create(broker=broker, url=url, token="tok-mailer")
    return SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer)


def test_a_410_answered_while_its_saas_connection_is_retired_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    simulator, arrived, release = held_410
    deletion = _saas_deletion(broker, simulator.url)

    errors = _race(
        lambda: saas_deletions_deliver(deletion_ids=[deletion.pk]),
        arrived,
        release,
        lambda: saas_connection_retire(
            connection=deletion.saas_connection, reason="replaced", actor="test"
        ),
    )

    assert errors == []
    mailer = SaasConnection.objects.get(pk=deletion.saas_connection_id)
    assert mailer.retired_at is not None and not mailer.enabled
    deletion = SaasDeletion.objects.get(pk=deletion.pk)
    assert deletion.state == RequestState.CANCELLED
    assert deletion.delivery_attempts.get().status == 410


def test_a_410_answered_while_its_saas_connection_is_enabled_again_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    simulator, arrived, release = held_410
    deletion = _saas_deletion(broker, simulator.url)

    def pause_and_enable() -> None:
        saas_connection_disable(connection=deletion.saas_connection, reason="paused", actor="t")
        saas_connection_enable(connection=deletion.saas_connection, actor="test")

    errors = _race(
        lambda: saas_deletions_deliver(deletion_ids=[deletion.pk]),
        arrived,
        release,
        pause_and_enable,
    )

    assert errors == []
    assert SaasConnection.objects.get(pk=deletion.saas_connection_id).enabled
    deletion = SaasDeletion.objects.get(pk=deletion.pk)
    assert deletion.state == RequestState.QUEUED
    assert deletion.delivery_attempts.get().status == 410
