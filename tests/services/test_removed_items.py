"""Once DROP's Removed file names an identifier, nothing more is sent to the broker for it:
every request not final is cancelled (failed and undeliverable ones too), and redelivery and
redispatch, by staff or by the automatic policy, refuse with a clear reason.
"""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone

from devtools.drop_simulator import work_items
from integrations.models import (
    Broker,
    DeletionRequest,
    RequestState,
    ResolutionRequest,
    WorkItem,
    WorkItemState,
)
from integrations.services.dispatch.redelivery import (
    deletion_request_redeliver,
    deletion_request_redispatch,
    deletion_requests_redispatch_failed,
    resolution_request_redeliver,
    saas_deletion_redeliver,
)
from integrations.services.staff.integrations import webhook_integration_create
from tests.builders import (
    ConsumerFactory,
    SaasConnectionFactory,
    SaasDeletionFactory,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(4))


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _import(broker: Broker, tmp_path: Path, name: str, **lists: Any) -> None:
    removed = lists.pop("removed", None)
    package = write_zip(tmp_path, drop_zip(broker, lists, removed), name=name)
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())


def test_a_removed_identifier_gets_nothing_more_sent_for_it(broker: Broker, tmp_path: Path) -> None:
    mailer = SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    webhook_integration_create(broker=broker, name="CRM", url="http://127.0.0.1:9/d", actor="t")
    for n, (_, email_hash) in enumerate(ITEMS):
        ConsumerFactory.create(
            broker=broker, remote_identifier=f"C-{n}", hashes={"email": email_hash}
        )
    _import(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS)
    requests = {r.remote_identifier: r for r in DeletionRequest.objects.all()}
    # One request per state a Removed file used to leave alone, and one dispatched.
    past = timezone.now() - dt.timedelta(days=3)
    states: dict[str, dict[str, Any]] = {
        "C-0": {"state": RequestState.FAILED, "drop_outcome": "failed", "completed_at": past},
        "C-1": {"state": RequestState.UNDELIVERABLE},
        "C-2": {"state": RequestState.DISPATCHED, "dispatched_at": past},
        "C-3": {"state": RequestState.QUEUED},
    }
    for remote, fields in states.items():
        DeletionRequest.objects.filter(pk=requests[remote].pk).update(**fields)
    resolution = ResolutionRequest.objects.get(remote_identifier="C-1")
    ResolutionRequest.objects.filter(pk=resolution.pk).update(state=RequestState.UNDELIVERABLE)
    saas = SaasDeletionFactory.create(
        resolution=resolution, saas_connection=mailer, state=RequestState.UNDELIVERABLE
    )
    by_id = {
        r.remote_identifier: WorkItem.objects.get(deletion_requests=r) for r in requests.values()
    }

    removed = [(by_id[f"C-{n}"].work_item_id, ITEMS[n][1], "Email") for n in range(4)]
    _import(broker, tmp_path, "20261121_4821_DROP.zip", Email=[], removed=removed)

    assert set(WorkItem.objects.values_list("state", flat=True)) == {WorkItemState.REMOVED}
    states_now = {r.remote_identifier: r.state for r in DeletionRequest.objects.all()}
    assert states_now == {
        "C-0": RequestState.CANCELLED,
        "C-1": RequestState.CANCELLED,
        "C-2": RequestState.DISPATCHED,  # the broker may be acting on it: left to finish
        "C-3": RequestState.CANCELLED,
    }
    saas.refresh_from_db()
    assert saas.state == RequestState.CANCELLED
    assert not ResolutionRequest.objects.exclude(state__in=["cancelled", "dispatched"]).exists()

    # Staff cannot send any of them again, whatever its state.
    for remote in ("C-0", "C-1", "C-2", "C-3"):
        request = DeletionRequest.objects.get(remote_identifier=remote)
        with pytest.raises(ValidationError, match="removed by DROP"):
            deletion_request_redeliver(deletion_request=request, actor="staff:ann")
        with pytest.raises(ValidationError, match="removed by DROP"):
            deletion_request_redispatch(deletion_request=request, actor="staff:ann")
    with pytest.raises(ValidationError, match="removed by DROP"):
        resolution_request_redeliver(resolution_request=resolution, actor="staff:ann")
    with pytest.raises(ValidationError, match="removed by DROP"):
        saas_deletion_redeliver(saas_deletion=saas, actor="staff:ann")

    # Nor the automatic policy, even for the dispatched one that fails after the removal.
    DeletionRequest.objects.filter(remote_identifier="C-2").update(
        state=RequestState.FAILED, drop_outcome="failed", completed_at=past
    )
    assert deletion_requests_redispatch_failed(failed_before=timezone.now()) == 0
    assert DeletionRequest.objects.get(remote_identifier="C-2").state == RequestState.FAILED
