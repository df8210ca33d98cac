"""Requests matched while the broker had no deletion target (state ``pending``) get their
targets, and whatever else the match would have made, as soon as a target becomes
available: an integration created, or an ISI connection list refreshed. A disabled
integration is still a target: matched meanwhile, its requests wait (queued, never tried)
and enabling it sends them.

Matching runs as operators run it (``drop import``); targets are added and enabled through
the services and the ``integrations`` command staff use.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.broker_simulator import BrokerSimulator
from devtools.drop_simulator import DropSimulator, work_items
from devtools.isi_simulator import IsiSimulator, connection
from integrations.consumers.readers import ConsumerRecord
from integrations.drop.client import DropClient, DropLimits
from integrations.models import (
    Broker,
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle.consumers import consumers_register
from integrations.services.cycle.isi_connections import isi_connections_refresh
from integrations.services.dispatch.deliveries import (
    deletion_requests_deliver,
    resolution_requests_deliver,
)
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.dispatch.redelivery import deletion_request_redeliver
from integrations.services.dispatch.resolutions import resolution_outcome_record
from integrations.services.ledger import ledger_seal, ledger_verify
from integrations.services.reporting.reports import report_run
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    webhook_integration_create,
)
from tests.builders import (
    CONNECTION_A,
    CONNECTION_B,
    ConsumerFactory,
    SaasConnectionFactory,
    drop_zip,
    isi_integration_created,
    write_zip,
)

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(4))
KEY = "dk_test_7Qz9pendingKEY4"


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _import(broker: Broker, tmp_path: Path, items: list[tuple[str, str]], name: str) -> None:
    package = write_zip(tmp_path, drop_zip(broker, {"Email": items}), name=name)
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())


def _matched(broker: Broker, tmp_path: Path, *, state: str = "pending") -> None:
    """Two consumers matched while the broker has no enabled target: their requests wait
    for one (``pending``), or for a disabled one (``queued``, never tried)."""
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    ConsumerFactory.create(broker=broker, remote_identifier="C-2", hashes={"email": ITEMS[1][1]})
    _import(broker, tmp_path, ITEMS[:3], "20261120_4821_DROP.zip")
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {state}
    assert not DeliveryAttempt.objects.exists()


def _queued_jobs(task: str) -> set[int]:
    ids: set[int] = set()
    for args in ProcrastinateJob.objects.filter(task_name__endswith=task).values_list(
        "args", flat=True
    ):
        ids.update(args.get("request_ids", []))
    return ids


def test_enabling_a_disabled_webhook_integration_queues_what_was_matched_meanwhile(
    broker: Broker, tmp_path: Path
) -> None:
    created = webhook_integration_create(
        broker=broker, name="CRM", url="http://127.0.0.1:9/drop", actor="test"
    )
    integration_disable(integration=created.integration, reason="HTTP 410", actor="test")
    _matched(broker, tmp_path, state="queued")
    deletion_requests_deliver(
        request_ids=list(DeletionRequest.objects.values_list("pk", flat=True))
    )
    assert not DeliveryAttempt.objects.exists()  # held while it is disabled: no attempt burnt

    out = io.StringIO()
    call_command("integrations", "enable", str(created.integration.uuid), stdout=out)

    requests = list(DeletionRequest.objects.all())
    assert {r.remote_identifier for r in requests} == {"C-1", "C-2"}
    assert {(r.state, r.integration_id) for r in requests} == {
        (RequestState.QUEUED, created.integration.pk)
    }
    assert _queued_jobs("deliver_deletion_requests") == {r.pk for r in requests}
    assert "2 request(s) queued" in out.getvalue()
    event = LedgerEvent.objects.get(kind="integration.enabled")
    assert event.data["deletion_requests_queued"] == 2
    assert event.actor.startswith("cli")


def test_a_new_target_gets_the_identifier_retrievals_the_match_would_have_made(
    broker: Broker, tmp_path: Path
) -> None:
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    _matched(broker, tmp_path)
    assert not ResolutionRequest.objects.exists()
    Broker.objects.filter(pk=broker.pk).update(mode="production")

    created = webhook_integration_create(
        broker=broker, name="CRM", url="http://127.0.0.1:9/drop", actor="test"
    )

    resolutions = list(ResolutionRequest.objects.all())
    assert sorted(r.remote_identifier for r in resolutions) == ["C-1", "C-2"]
    # As the deletion request each goes with, sent to the same target: the match's mode.
    assert {(r.broker_id_code, r.mode) for r in resolutions} == {("4821", "test")}
    assert {(r.state, r.integration_id) for r in resolutions} == {
        (RequestState.QUEUED, created.integration.pk)
    }
    assert all(re.fullmatch(r"[0-9a-f]{64}", r.results_token) for r in resolutions)
    assert _queued_jobs("deliver_resolution_requests") == {r.pk for r in resolutions}
    # Each work item has its retrieval, so neither settles on the deletion outcome alone.
    for request in DeletionRequest.objects.all():
        assert ResolutionRequest.objects.filter(
            work_item_id=request.work_item_id, remote_identifier=request.remote_identifier
        ).exists()
    # Created once: another target later does not add retrievals for the same target twice.
    webhook_integration_create(broker=broker, name="CRM 2", url="http://127.0.0.1:9/b", actor="t")
    assert ResolutionRequest.objects.count() == 2


@pytest.fixture
def api() -> Iterator[IsiSimulator]:
    with IsiSimulator(connections=[connection(CONNECTION_A), connection(CONNECTION_B)]) as running:
        yield running


def test_enabling_an_isi_integration_gives_each_connection_its_request(
    broker: Broker, api: IsiSimulator, tmp_path: Path
) -> None:
    created = isi_integration_created(broker, api)
    integration_disable(integration=created.integration, reason="maintenance", actor="test")
    _matched(broker, tmp_path, state="queued")

    integration_enable(integration=created.integration, actor="staff:ann")

    requests = list(DeletionRequest.objects.select_related("isi_connection"))
    assert {
        (r.remote_identifier, str(getattr(r.isi_connection, "uuid", ""))) for r in requests
    } == {(c, u) for c in ("C-1", "C-2") for u in (CONNECTION_A, CONNECTION_B)}
    assert {r.state for r in requests} == {RequestState.QUEUED}
    assert len({r.results_token for r in requests}) == 4
    assert all(re.fullmatch(r"[0-9a-f]{64}", r.results_token or "") for r in requests)


def test_a_refreshed_connection_list_targets_pending_requests_of_a_webhook_less_broker(
    broker: Broker, api: IsiSimulator, tmp_path: Path
) -> None:
    api.connections[:] = []  # nothing takes part yet
    created = isi_integration_created(broker, api)
    _matched(broker, tmp_path)
    api.connections.append(connection(CONNECTION_A))

    refreshed = isi_connections_refresh(integration=created.integration, actor="test")

    assert refreshed.pending_requests_queued == 2
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {"queued"}


def test_pending_requests_of_a_removed_work_item_are_not_targeted(
    broker: Broker, tmp_path: Path
) -> None:
    _matched(broker, tmp_path)
    removed = DeletionRequest.objects.get(remote_identifier="C-1")
    WorkItem.objects.filter(deletion_requests=removed).update(state=WorkItemState.REMOVED)

    webhook_integration_create(broker=broker, name="CRM", url="http://127.0.0.1:9/d", actor="t")

    removed.refresh_from_db()
    assert (removed.state, removed.integration_id) == (RequestState.PENDING, None)
    assert DeletionRequest.objects.get(remote_identifier="C-2").state == RequestState.QUEUED


def test_disable_and_enable_commands_write_their_ledger_events(broker: Broker) -> None:
    created = webhook_integration_create(
        broker=broker, name="CRM", url="http://127.0.0.1:9/drop", actor="test"
    )
    uuid = str(created.integration.uuid)

    out = io.StringIO()
    call_command("integrations", "disable", uuid, "--reason", "broker asked", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "uuid": uuid,
        "enabled": False,
        "disabled_reason": "broker asked",
        "changed": True,
    }
    integration = Integration.objects.get(uuid=uuid)
    assert (integration.enabled, integration.disabled_reason) == (False, "broker asked")
    assert LedgerEvent.objects.get(kind="integration.disabled").data["reason"] == "broker asked"

    out = io.StringIO()
    call_command("integrations", "enable", uuid, "--json", stdout=out)
    assert json.loads(out.getvalue())["changed"] is True
    assert Integration.objects.get(uuid=uuid).enabled
    assert LedgerEvent.objects.filter(kind="integration.enabled").count() == 1


def test_disable_and_enable_refuse_an_unknown_integration(broker: Broker) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no integration with UUID"):
        call_command("integrations", "disable", "6f1c8d52-6a43-4a8e-9d0e-6c2a8e9f4b11")
    with pytest.raises(CommandError, match="not an integration UUID"):
        call_command("integrations", "enable", "nope")


# -- the whole path: disabled, matched meanwhile, enabled, answered, reported -----------------


@pytest.fixture
def drop() -> Iterator[DropSimulator]:
    with DropSimulator(api_key=KEY, broker_id="4821", active_download=True) as simulator:
        yield simulator


@pytest.fixture
def broker_system() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/drop/webhook") as running:
        yield running


def test_a_webhook_integration_disabled_then_enabled_gets_every_match_and_they_reach_drop(
    broker: Broker, drop: DropSimulator, broker_system: BrokerSimulator, tmp_path: Path
) -> None:
    broker.drop_api_key, broker.drop_base_url = KEY, drop.url
    broker.save()
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    created = webhook_integration_create(
        broker=broker, name="CRM", url=broker_system.url, actor="test"
    )
    call_command(
        "integrations", "disable", str(created.integration.uuid), "--reason", "HTTP 410",
        stdout=io.StringIO(),
    )  # fmt: skip
    # Matched while it is disabled: at import, and later when a consumer registers.
    _matched(broker, tmp_path, state="queued")
    consumers_register(
        broker=broker,
        records=[ConsumerRecord(1, "C-3", None, (("email", base64.b64decode(ITEMS[2][1])),))],
        actor="test",
        source="api",
    )
    assert (
        DeletionRequest.objects.filter(state="queued", integration=created.integration).count() == 3
    )

    call_command("integrations", "enable", str(created.integration.uuid), stdout=io.StringIO())

    requests = {r.remote_identifier: r for r in DeletionRequest.objects.all()}
    resolutions = {r.remote_identifier: r for r in ResolutionRequest.objects.all()}
    assert set(requests) == set(resolutions) == {"C-1", "C-2", "C-3"}
    assert {r.state for r in [*requests.values(), *resolutions.values()]} == {"queued"}

    # Delivered to the broker's system, signed with the integration's secret.
    broker_system.secrets = [created.webhook_secret]
    deletion_requests_deliver(request_ids=[r.pk for r in requests.values()])
    resolution_requests_deliver(request_ids=[r.pk for r in resolutions.values()])
    received = broker_system.wait_for(6)
    assert all(n.signature_ok for n in received)
    assert sorted(n.json["topic"] for n in received) == (
        ["drop.deletion:create"] * 3 + ["drop.resolution:create"] * 3
    )
    requests = {r.remote_identifier: r for r in DeletionRequest.objects.all()}
    resolutions = {r.remote_identifier: r for r in ResolutionRequest.objects.all()}
    assert {r.state for r in [*requests.values(), *resolutions.values()]} == {"dispatched"}

    # The broker answers every deletion and every identifier retrieval.
    outcomes = {"C-1": "deleted", "C-2": "not_found", "C-3": "deleted"}
    for remote, outcome in outcomes.items():
        deletion_outcome_record(deletion_request=requests[remote], drop_outcome=outcome, actor="t")
    resolution_outcome_record(
        resolution_request=resolutions["C-1"],
        drop_outcome="opted_out",
        exemption_basis="",
        identifiers={},
        opt_out_email="ann@example.com",
        actor="t",
    )
    for remote in ("C-2", "C-3"):
        resolution_outcome_record(
            resolution_request=resolutions[remote],
            drop_outcome="exempt",
            exemption_basis="legal_hold",
            identifiers={},
            actor="t",
        )

    client = DropClient(
        drop.url,
        KEY,
        sleep=lambda s: None,
        limits=DropLimits(max_retries=1, connect_timeout=1, read_timeout=2),
        allow_private=True,
    )
    run = report_run(broker=broker, upload=True, client=client, actor="test")

    assert run.error is None
    (uploaded,) = drop.uploaded.values()
    rows = dict(line.split(",") for line in uploaded.decode().split("\r\n")[1:-1])
    by_remote = {
        remote: WorkItem.objects.get(deletion_requests=request).work_item_id
        for remote, request in requests.items()
    }
    # The retrieval's answer counts: opted out (4) over deleted (3) over exempt (2) over
    # not found (5).
    assert rows[by_remote["C-1"]] == "4"
    assert rows[by_remote["C-2"]] == "2"
    assert rows[by_remote["C-3"]] == "3"
    assert set(WorkItem.objects.values_list("state", flat=True)) == {WorkItemState.REPORTED}
    ledger_seal()
    assert ledger_verify().ok


def test_staff_redelivery_of_a_pending_request_says_what_to_do(
    broker: Broker, tmp_path: Path
) -> None:
    from django.core.exceptions import ValidationError

    _matched(broker, tmp_path)
    pending = DeletionRequest.objects.filter(state="pending").first()
    assert pending is not None

    with pytest.raises(ValidationError, match="add or enable an integration"):
        deletion_request_redeliver(deletion_request=pending, actor="staff:ann")
