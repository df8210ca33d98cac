"""A broker's first DROP cycle taken through the services, so that its ledger holds every
event an evidence pack cross-checks::

    with DropSimulator(...) as drop:
        cycle = evidence_world(broker, drop, tmp_path)

Eight work items: three match and get ``deleted``, ``exempt`` and ``opted_out``; the other
five are not found; the response files are uploaded to the loopback DROP stand-in.
"""

from __future__ import annotations

from pathlib import Path

from devtools.drop_simulator import DropSimulator, work_items
from integrations.drop.client import DropClient
from integrations.models import Broker, DeletionRequest, DropCycle
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.reporting.reports import report_run
from tests.builders import (
    ConsumerFactory,
    WebhookIntegrationFactory,
    drop_zip,
    write_zip,
)

DROP_KEY = "dk_test_evidenceKEY_1"
OUTCOMES = ("deleted", "exempt", "opted_out")


def evidence_world(broker: Broker, drop: DropSimulator, directory: Path) -> DropCycle:
    broker.drop_api_key = DROP_KEY
    broker.drop_base_url = drop.url
    broker.save()
    WebhookIntegrationFactory.create(broker=broker)
    items = list(work_items(8))
    for n, (_, identifier_hash) in enumerate(items[: len(OUTCOMES)]):
        ConsumerFactory.create(
            broker=broker, remote_identifier=f"C-{n}", hashes={"email": identifier_hash}
        )
    package = drop_zip(broker, {"Email": items[:6], "Phone": items[6:]})
    imported = drop_zip_import(broker=broker, path=write_zip(directory, package), actor="test")
    requests = DeletionRequest.objects.filter(broker=broker).order_by("pk")
    for request, outcome in zip(requests, OUTCOMES, strict=True):
        deletion_outcome_record(
            deletion_request=request,
            drop_outcome=outcome,
            opt_out_email="household@example.com" if outcome == "opted_out" else "",
            actor="test",
        )
    # The stand-in listens on loopback: the one explicit opening of the outbound filter.
    client = DropClient(drop.url, DROP_KEY, allow_private=True)
    run = report_run(broker=broker, upload=True, client=client, actor="test")
    assert run.error is None and len(run.accepted) == 2, run
    return imported.cycle
