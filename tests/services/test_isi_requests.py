"""Matching with an ISI integration, through ``drop import`` as an operator runs it: the
broker's connections are listed again first, each match gets one deletion request per
connection taking part (and one identifier retrieval per such connection when the broker has
an enabled SaaS connection), each with its own 64-hex ``results_token``. An API that does
not answer does not hold the cycle up: the last known connections are used.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from devtools.broker_simulator import Reply
from devtools.drop_simulator import work_items
from devtools.isi_simulator import IsiSimulator, connection
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
)
from integrations.services.staff.integrations import integration_disable
from integrations.services.staff.isi import CreatedIsiIntegration
from tests.builders import (
    CONNECTION_A,
    CONNECTION_B,
    CONNECTION_STANDARD,
    ConsumerFactory,
    SaasConnectionFactory,
    drop_zip,
    isi_integration_created,
    write_zip,
)

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(3))


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def api() -> Iterator[IsiSimulator]:
    # When staff set it up, only one connection took part.
    first = [connection(CONNECTION_A), connection(CONNECTION_STANDARD, ["privacy/delete"])]
    with IsiSimulator(connections=first) as running:
        yield running


@pytest.fixture
def created(broker: Broker, api: IsiSimulator) -> CreatedIsiIntegration:
    return isi_integration_created(broker, api)


@pytest.fixture
def package(broker: Broker, tmp_path: Path) -> Path:
    """Two matches (two consumers), one work item without a match."""
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    ConsumerFactory.create(broker=broker, remote_identifier="C-2", hashes={"email": ITEMS[1][1]})
    return write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS}))


def _targets(model: Any) -> set[tuple[str, str]]:
    return {
        (r.remote_identifier, str(r.isi_connection.uuid))
        for r in model.objects.select_related("isi_connection")
    }


def test_connections_are_listed_again_before_matching(
    broker: Broker, api: IsiSimulator, created: CreatedIsiIntegration, package: Path
) -> None:
    api.connections.append(connection(CONNECTION_B))  # added on the broker's side since

    call_command("drop", "import", "--broker", "4821", str(package))

    assert len(api.on("connections")) == 2
    assert _targets(DeletionRequest) == {
        (c, u) for c in ("C-1", "C-2") for u in (CONNECTION_A, CONNECTION_B)
    }
    for request in DeletionRequest.objects.all():
        assert request.integration_id == created.integration.pk
        assert request.state == RequestState.QUEUED
        assert re.fullmatch(r"[0-9a-f]{64}", request.results_token or "")
    assert DeletionRequest.objects.values("results_token").distinct().count() == 4
    assert not ResolutionRequest.objects.exists()  # no SaaS connection
    refreshed = LedgerEvent.objects.filter(kind="isi.connections_refreshed").latest("id")
    assert refreshed.actor.startswith("cli")


def test_with_a_saas_connection_each_match_also_gets_an_identifier_retrieval_per_connection(
    broker: Broker, created: CreatedIsiIntegration, package: Path
) -> None:
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")

    call_command("drop", "import", "--broker", "4821", str(package))

    expected = {(c, CONNECTION_A) for c in ("C-1", "C-2")}
    assert _targets(DeletionRequest) == expected
    assert _targets(ResolutionRequest) == expected
    resolutions = list(ResolutionRequest.objects.all())
    assert all(r.integration_id == created.integration.pk for r in resolutions)
    assert all(re.fullmatch(r"[0-9a-f]{64}", r.results_token) for r in resolutions)
    event = LedgerEvent.objects.get(kind="deletion_requests.created")
    assert (event.data["deletion_requests"], event.data["resolution_requests"]) == (2, 2)


def test_an_api_that_does_not_answer_leaves_the_last_known_connections(
    broker: Broker, api: IsiSimulator, created: CreatedIsiIntegration, package: Path
) -> None:
    api.connections.append(connection(CONNECTION_B))
    api.answer_next("connections", Reply(503))

    call_command("drop", "import", "--broker", "4821", str(package))

    assert _targets(DeletionRequest) == {(c, CONNECTION_A) for c in ("C-1", "C-2")}
    assert LedgerEvent.objects.filter(kind="isi.connections_refresh_failed").count() == 1
    assert LedgerEvent.objects.filter(kind="drop.cycle_imported").count() == 1


def test_a_disabled_integration_is_not_asked_but_stays_a_target(
    broker: Broker, api: IsiSimulator, created: CreatedIsiIntegration, package: Path
) -> None:
    integration_disable(integration=created.integration, reason="maintenance", actor="test")

    call_command("drop", "import", "--broker", "4821", str(package))

    assert len(api.on("connections")) == 1  # only when it was created
    # Paused, not gone: its last known connections get their requests, which wait.
    requests = DeletionRequest.objects.all()
    assert {(r.state, r.integration_id) for r in requests} == {
        (RequestState.QUEUED, created.integration.pk)
    }
