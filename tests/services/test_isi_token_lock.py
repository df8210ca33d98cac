"""An ISI delivery batch that fetched a new OAuth token, while its calls are in flight: it must
not hold its integration's row for them. Staff (a connection refresh, an edit) and the DROP
cycle's refresh before matching (which holds the broker's matching lock while it waits) lock
that row; held by the batch, they waited for every call of the batch to be answered, minutes
for a slow broker, and matching for the broker with them.

This test commits (threads and a second connection must see the rows).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import DatabaseError
from django.utils import timezone

from devtools.broker_simulator import Reply
from devtools.isi_simulator import IsiSimulator
from integrations.models import Broker, DeletionRequest, Integration, RequestState
from integrations.services.cycle import isi_tokens
from integrations.services.cycle.isi_connections import isi_connections_refresh
from integrations.services.dispatch.deliveries import deletion_requests_deliver
from integrations.services.staff.isi import isi_integration_update
from tests.builders import (
    CONNECTION_A,
    DeletionRequestFactory,
    broker_connections,
    isi_integration_created,
)
from tests.conftest import in_thread, sessions_waiting_for_locks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _deletes_held(api: IsiSimulator) -> tuple[threading.Event, threading.Event]:
    """Each delete of ``api`` held until ``release``; ``arrived`` once one came in."""
    arrived, release = threading.Event(), threading.Event()
    record = api._record

    def held(method: str, path: str, *args: Any, **kwargs: Any) -> Reply:
        reply = record(method, path, *args, **kwargs)
        if "/privacy/drop/delete/" in path:
            arrived.set()
            release.wait(30)
        return reply

    api._record = held  # type: ignore[method-assign]
    return arrived, release


def _stale_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached token has expired and this worker holds none: the batch fetches one."""
    Integration.objects.update(access_token_expires_at=timezone.now())
    monkeypatch.setattr(isi_tokens, "_held", {})


@pytest.mark.parametrize("staff_action", ["refresh", "rename"])
def test_a_batch_that_fetched_a_token_does_not_hold_its_integration_while_it_sends(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, staff_action: str
) -> None:
    with IsiSimulator(connections=broker_connections()) as api:
        integration = isi_integration_created(broker, api).integration
        _stale_everywhere(monkeypatch)
        request = DeletionRequestFactory.create(
            isi_connection=integration.connections.get(uuid=CONNECTION_A)
        )
        arrived, release = _deletes_held(api)
        errors: list[BaseException] = []
        delivering = in_thread(lambda: deletion_requests_deliver(request_ids=[request.pk]), errors)
        acting: threading.Thread | None = None
        try:
            assert arrived.wait(30), "the delete did not reach the broker"
            done = threading.Event()

            def act() -> None:
                if staff_action == "refresh":
                    isi_connections_refresh(integration=integration, actor="test")
                else:
                    isi_integration_update(integration=integration, name="Acme", actor="test")
                done.set()

            acting = in_thread(act, errors)
            wait_until(
                lambda: done.is_set() or sessions_waiting_for_locks() >= 1,
                "the staff action neither ended nor waited",
            )
            # Ended while the delete is still unanswered: nothing of the batch held it up.
            assert done.is_set(), "the staff action waited for the batch's calls"
        finally:
            release.set()
            delivering.join(60)
            if acting is not None:
                acting.join(60)

    assert errors == []
    assert DeletionRequest.objects.get(pk=request.pk).state == RequestState.DISPATCHED
    # The token the batch fetched is stored once it committed.
    stored = Integration.objects.get(pk=integration.pk)
    assert stored.access_token == api.on("delete")[0].headers["Authorization"].split()[1]
    assert stored.access_token_expires_at is not None
    assert stored.access_token_expires_at > timezone.now()


def test_a_token_fetched_before_staff_changed_the_credentials_is_not_stored_after(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staff are no longer held up by the batch: they may change the credentials (which drops
    the cached token) before it commits. The token it fetched with the old ones must not
    then be cached for every worker to use."""
    with IsiSimulator(connections=broker_connections()) as api:
        integration = isi_integration_created(broker, api).integration
        _stale_everywhere(monkeypatch)
        request = DeletionRequestFactory.create(
            isi_connection=integration.connections.get(uuid=CONNECTION_A)
        )
        arrived, release = _deletes_held(api)
        errors: list[BaseException] = []
        delivering = in_thread(lambda: deletion_requests_deliver(request_ids=[request.pk]), errors)
        try:
            assert arrived.wait(30), "the delete did not reach the broker"
            isi_integration_update(
                integration=integration,
                auth="oauth",
                token_url=api.token_url,
                client_id="another-client",
                client_secret="another-s3cret",
                actor="test",
            )
        finally:
            release.set()
            delivering.join(60)

    assert errors == []
    stored = Integration.objects.get(pk=integration.pk)
    assert (stored.client_id, stored.access_token, stored.access_token_expires_at) == (
        "another-client",
        "",
        None,
    )


def test_a_token_that_cannot_be_stored_after_the_batch_is_logged_without_it(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Storing is a cache: its failure once the batch committed must neither fail the batch
    (what was delivered stays delivered) nor put the token in the log."""
    with IsiSimulator(connections=broker_connections()) as api:
        integration = isi_integration_created(broker, api).integration
        _stale_everywhere(monkeypatch)
        request = DeletionRequestFactory.create(
            isi_connection=integration.connections.get(uuid=CONNECTION_A)
        )

        def broken(pk: int, held: Any) -> None:
            raise DatabaseError("the server went away")

        monkeypatch.setattr(isi_tokens, "_access_token_write", broken)

        assert deletion_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}

    token = api.on("delete")[0].headers["Authorization"].split()[1]
    assert "the server went away" in caplog.text
    assert token not in caplog.text
    assert DeletionRequest.objects.get(pk=request.pk).state == RequestState.DISPATCHED
