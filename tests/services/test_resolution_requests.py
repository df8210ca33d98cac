"""Matching creates identifier retrieval requests only for a broker with a SaaS connection
that is not retired (a disabled one is paused: it still gets its deletions later): one per
match and webhook integration (a disabled one included), queued with their job, each with its
own unique 64-hex ``results_token``. Through ``drop import``, as an operator runs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import call_command
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import work_items
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
)
from integrations.services.staff.saas import saas_connection_retire
from tests.builders import (
    ConsumerFactory,
    SaasConnectionFactory,
    WebhookIntegrationFactory,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(3))
RESOLUTION_TASK = "integrations.tasks.deliver_resolution_requests"


@pytest.fixture
def package(broker: Broker, tmp_path: Path) -> Path:
    """Two matches (two consumers), one work item without a match."""
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    ConsumerFactory.create(broker=broker, remote_identifier="C-2", hashes={"email": ITEMS[1][1]})
    return write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS}))


@pytest.mark.parametrize("saas_enabled", [True, False])
def test_with_a_saas_connection_each_match_gets_a_resolution_per_webhook(
    broker: Broker, package: Path, saas_enabled: bool
) -> None:
    first, second = (
        WebhookIntegrationFactory.create(broker=broker, name="CRM"),
        WebhookIntegrationFactory.create(broker=broker, name="Warehouse"),
    )
    paused = WebhookIntegrationFactory.create(broker=broker, name="Paused", enabled=False)
    SaasConnectionFactory.create(
        broker=broker, url="https://api.mailer.example/erase", enabled=saas_enabled
    )

    call_command("drop", "import", "--broker", "4821", str(package))

    resolutions = list(ResolutionRequest.objects.order_by("pk"))
    assert len(resolutions) == 6  # 2 matches x 3 webhook integrations, the paused one too
    assert {(r.remote_identifier, r.integration_id) for r in resolutions} == {
        (c, i.pk) for c in ("C-1", "C-2") for i in (first, second, paused)
    }
    assert all(r.state == RequestState.QUEUED for r in resolutions)
    assert all(re.fullmatch(r"[0-9a-f]{64}", r.results_token) for r in resolutions)
    assert len({r.results_token for r in resolutions}) == 6
    assert all(r.drop_session_id == "1" for r in resolutions)
    assert all(r.remote_identifier_kind == "external_id" for r in resolutions)
    # The notification's broker fields, fixed now as the deletion requests' are.
    assert {(r.broker_id_code, r.mode) for r in resolutions} == {("4821", "test")}
    jobs = ProcrastinateJob.objects.filter(task_name=RESOLUTION_TASK)
    assert sorted(pk for job in jobs for pk in job.args["request_ids"]) == [
        r.pk for r in resolutions
    ]
    assert DeletionRequest.objects.count() == 6  # deletions are created as before
    event = LedgerEvent.objects.get(kind="deletion_requests.created")
    assert event.data["resolution_requests"] == 6


@pytest.mark.parametrize("saas", ["none", "retired"])
def test_without_a_saas_connection_no_resolution_is_requested(
    broker: Broker, package: Path, saas: str
) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    if saas == "retired":
        saas_connection_retire(
            connection=SaasConnectionFactory.create(
                broker=broker, url="https://api.mailer.example/erase"
            ),
            reason="contract ended",
            actor="test",
        )

    call_command("drop", "import", "--broker", "4821", str(package))

    assert not ResolutionRequest.objects.exists()
    assert not ProcrastinateJob.objects.filter(task_name=RESOLUTION_TASK).exists()
    assert DeletionRequest.objects.count() == 2
