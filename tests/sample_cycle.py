"""A broker part-way through DROP cycles, written straight to the tables (no services).

For the admin and dashboard tests: every model of the cycle has rows, in known numbers::

    world = sample_cycle(broker, today=date(2026, 3, 20))
    world.cycle.pk, world.integration.pk, world.requests["failed"]
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from dataclasses import dataclass, field

from integrations.models import (
    Broker,
    Consumer,
    ConsumerHash,
    DeletionRequest,
    DeliveryAttempt,
    DropCycle,
    Integration,
    IntegrationKind,
    OptOutRecord,
    ReportFile,
    ReportFileState,
    ReportKind,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    UnreadableWorkItem,
    WorkItem,
    WorkItemState,
)

_ids = itertools.count(1)

# The current cycle's work items: (state, status_code) -> how many.
CURRENT_ITEMS: dict[tuple[str, int | None], int] = {
    (WorkItemState.OPEN, None): 4,
    (WorkItemState.REPORTABLE, 3): 3,
    (WorkItemState.REPORTABLE, 4): 1,
    (WorkItemState.REPORTABLE, 5): 6,
    (WorkItemState.REMOVED, None): 1,
}
# The previous (reported) cycle's.
PREVIOUS_ITEMS: dict[tuple[str, int | None], int] = {
    (WorkItemState.REPORTED, 3): 5,
    (WorkItemState.REPORTED, 2): 2,
    (WorkItemState.REPORTED, 5): 9,
}


@dataclass
class SampleCycle:
    broker: Broker
    integration: Integration
    previous: DropCycle
    cycle: DropCycle
    report_file: ReportFile
    consumer: Consumer
    requests: dict[str, DeletionRequest] = field(default_factory=dict)


def _hash(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _cycle(broker: Broker, session: str, downloaded: dt.datetime, **fields: object) -> DropCycle:
    return DropCycle.objects.create(
        broker=broker,
        drop_session_id=session,
        zip_name=f"{downloaded:%Y%m%d}_{broker.broker_id}_DROP.zip",
        zip_sha256=hashlib.sha256(f"{broker.pk}-{session}".encode()).hexdigest(),
        downloaded_at=downloaded,
        match_date=downloaded.date(),
        due_date=downloaded.date() + dt.timedelta(days=45),
        **fields,
    )


def _items(cycle: DropCycle, spec: dict[tuple[str, int | None], int]) -> list[WorkItem]:
    items = []
    for (state, status_code), n in spec.items():
        for _ in range(n):
            number = next(_ids)
            items.append(
                WorkItem(
                    broker=cycle.broker,
                    cycle=cycle,
                    work_item_id=f"WI{number:010d}",
                    hash_type="email",
                    hash=_hash(f"item-{number}"),
                    file_name=f"{cycle.match_date:%Y%m%d}_{cycle.broker.broker_id}_Email.csv",
                    state=state,
                    status_code=status_code,
                )
            )
    return WorkItem.objects.bulk_create(items)


def sample_cycle(broker: Broker, *, today: dt.date) -> SampleCycle:
    """Cycle "1" reported (uploaded), cycle "2" open since 10 days before ``today``."""
    noon = dt.time(12, tzinfo=dt.UTC)
    previous = _cycle(
        broker,
        "1",
        dt.datetime.combine(today - dt.timedelta(days=60), noon),
        state="reported",
        work_items=16,
    )
    cycle = _cycle(
        broker, "2", dt.datetime.combine(today - dt.timedelta(days=10), noon), work_items=15
    )
    _items(previous, PREVIOUS_ITEMS)
    open_items = _items(cycle, CURRENT_ITEMS)
    report_file = ReportFile.objects.create(
        broker=broker,
        cycle=previous,
        kind=ReportKind.UPLOAD,
        file_name=f"{previous.match_date:%Y%m%d}_{broker.broker_id}_Email.csv",
        rows=16,
        sha256="0" * 64,
        content=b"Id,Status\r\n",
        state=ReportFileState.ACCEPTED,
        uploaded_at=previous.downloaded_at + dt.timedelta(days=3),
    )
    # Written for the open cycle but not uploaded yet (manual upload mode).
    ReportFile.objects.create(
        broker=broker,
        cycle=cycle,
        kind=ReportKind.UPLOAD,
        file_name=f"{cycle.match_date:%Y%m%d}_{broker.broker_id}_Email.csv",
        rows=10,
        sha256="1" * 64,
        content=b"Id,Status\r\n",
    )
    integration = Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.WEBHOOK,
        name="Acme deletions",
        url="https://hooks.example.com/drop",
        webhook_secret="whsec_" + "A" * 43,
    )
    consumer = Consumer.objects.create(broker=broker, remote_identifier="C-1")
    ConsumerHash.objects.create(
        consumer=consumer, broker=broker, hash_type="email", hash=_hash("C-1")
    )
    now = dt.datetime.combine(today, noon)
    world = SampleCycle(broker, integration, previous, cycle, report_file, consumer)
    states = {
        "failed": (RequestState.FAILED, now - dt.timedelta(days=2)),
        "undeliverable": (RequestState.UNDELIVERABLE, None),
        "stale": (RequestState.DISPATCHED, now - dt.timedelta(days=8)),
        "recent": (RequestState.DISPATCHED, now - dt.timedelta(days=1)),
        "completed": (RequestState.COMPLETED, now - dt.timedelta(days=3)),
    }
    for item, (name, (state, dispatched_at)) in zip(open_items, states.items(), strict=False):
        world.requests[name] = DeletionRequest.objects.create(
            broker=broker,
            work_item=item,
            consumer=consumer,
            integration=integration,
            identifier_hash="A" * 43 + "=",
            hash_type="email",
            drop_session_id=cycle.drop_session_id,
            match_date=cycle.match_date,
            broker_id_code=broker.broker_id,
            mode=broker.mode,
            remote_identifier="C-1",
            state=state,
            dispatched_at=dispatched_at,
            error_message="crm timeout" if state == RequestState.FAILED else "",
        )
    # The integration answered 2xx two days ago, then failed three times.
    attempts = [
        ("completed", 200, 2.0),
        ("undeliverable", 500, 1.5),
        ("undeliverable", None, 1.0),
        ("undeliverable", 503, 0.5),
    ]
    for number, (request, status, days_ago) in enumerate(attempts, start=1):
        DeliveryAttempt.objects.create(
            deletion_request=world.requests[request],
            number=number,
            started_at=now - dt.timedelta(days=days_ago),
            url=integration.url,
            status=status,
            error="" if status else "connection refused",
        )
    # Resolution: a notification awaiting its answer, and one answered whose SaaS deletion
    # could not be delivered; an opt-out record.
    saas = SaasConnection.objects.create(
        broker=broker, name="Mailer", url="https://api.mailer.example/erase", token="tok"
    )
    for n, (state, identifiers) in enumerate(
        [(RequestState.DISPATCHED, ""), (RequestState.COMPLETED, '{"email":[{"email":"a@x.com"}]}')]
    ):
        resolution = ResolutionRequest.objects.create(
            broker=broker,
            work_item=open_items[n],
            consumer=consumer,
            integration=integration,
            results_token=f"{broker.pk:032x}{n:032x}",
            drop_session_id=cycle.drop_session_id,
            match_date=cycle.match_date,
            remote_identifier="C-1",
            state=state,
            dispatched_at=now - dt.timedelta(days=1),
            identifiers=identifiers,
        )
    SaasDeletion.objects.create(
        resolution=resolution, saas_connection=saas, state=RequestState.UNDELIVERABLE, attempts=10
    )
    OptOutRecord.objects.create(
        deletion_request=world.requests["completed"], broker=broker, email="Opted.Out@Example.com"
    )
    # A row of the reported cycle DROP sent malformed (answered in DROP's portal since).
    UnreadableWorkItem.objects.create(
        broker=broker,
        cycle=previous,
        file_name=report_file.file_name,
        line=18,
        work_item_id="680",
        text="680,5",
        reason="hash must be 44 characters of standard Base64 ending in '=', found '5'",
    )
    return world
