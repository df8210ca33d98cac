"""Small factories for reporting tests: cycles, work items and requests with outcomes.

Written straight to the tables (no matching, no dispatch), so a test states exactly the
situation it needs::

    cycle = cycle_make(broker)
    item = item_make(cycle, list_type="Email", status_code=5)
    request_make(item, outcome="deleted")
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from dataclasses import dataclass
from typing import Any

from django.db.models import F
from django.utils import timezone

from integrations.drop.reporting import build_response_file, response_name
from integrations.models import (
    DROP_STATUS_CODES,
    Broker,
    Consumer,
    DeletionRequest,
    DeliveryAttempt,
    DropCycle,
    Integration,
    IntegrationKind,
    ReportFile,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)

_numbers = itertools.count(1)
HASH_TYPES = {"Email": "email", "Phone": "phone", "NDZ": "ndz", "MAID": "maid"}
DAY = dt.date(2026, 3, 12)


def list_file_name(cycle: DropCycle, list_type: str = "Email") -> str:
    return f"{cycle.match_date:%Y%m%d}_{cycle.broker.broker_id}_{list_type}.csv"


def cycle_make(
    broker: Broker,
    *,
    session: str = "1",
    downloaded_on: dt.date = DAY,
    due_in_days: int = 45,
    **fields: Any,
) -> DropCycle:
    downloaded_at = dt.datetime.combine(downloaded_on, dt.time(9), tzinfo=dt.UTC)
    return DropCycle.objects.create(
        broker=broker,
        drop_session_id=session,
        zip_name=f"{downloaded_on:%Y%m%d}_{broker.broker_id}_DROP.zip",
        zip_sha256=hashlib.sha256(f"{broker.pk}:{session}".encode()).hexdigest(),
        downloaded_at=downloaded_at,
        match_date=downloaded_on,
        due_date=downloaded_on + dt.timedelta(days=due_in_days),
        **fields,
    )


def item_make(
    cycle: DropCycle,
    *,
    list_type: str = "Email",
    status_code: int | None = None,
    state: str | None = None,
    work_item_id: str | None = None,
    **fields: Any,
) -> WorkItem:
    number = next(_numbers)
    if state is None:
        state = WorkItemState.OPEN if status_code is None else WorkItemState.REPORTABLE
    return WorkItem.objects.create(
        broker=cycle.broker,
        cycle=cycle,
        work_item_id=work_item_id or f"W{number:011d}",
        hash_type=HASH_TYPES[list_type],
        hash=hashlib.sha256(f"item-{number}".encode()).digest(),
        file_name=list_file_name(cycle, list_type),
        state=state,
        status_code=status_code,
        **fields,
    )


def integration_make(broker: Broker, name: str = "Acme CRM") -> Integration:
    return Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.WEBHOOK,
        name=name,
        url="https://hooks.example.com/drop",
        webhook_secret="whsec_" + "A" * 43,
    )


def request_make(
    item: WorkItem,
    *,
    outcome: str = "",
    state: str | None = None,
    integration: Integration | None = None,
    remote_identifier: str = "C-1",
    **fields: Any,
) -> DeletionRequest:
    """A deletion request; with an ``outcome`` it is completed (``failed`` too, as recorded)."""
    if state is None:
        state = (
            RequestState.FAILED
            if outcome == "failed"
            else RequestState.COMPLETED
            if outcome
            else RequestState.DISPATCHED
        )
    now = timezone.now()
    defaults: dict[str, Any] = {
        "dispatched_at": now if state != RequestState.QUEUED else None,
        "completed_at": now if outcome else None,
        "drop_status_code": DROP_STATUS_CODES.get(outcome),
    }
    defaults.update(fields)
    consumer, _ = Consumer.objects.get_or_create(
        broker=item.broker, remote_identifier=remote_identifier
    )
    return DeletionRequest.objects.create(
        broker=item.broker,
        work_item=item,
        consumer=consumer,
        integration=integration,
        identifier_hash="A" * 43 + "=",
        hash_type=item.hash_type,
        drop_session_id=item.cycle.drop_session_id,
        match_date=item.cycle.match_date,
        broker_id_code=item.broker.broker_id,
        mode=item.broker.mode,
        remote_identifier=remote_identifier,
        state=state,
        drop_outcome=outcome,
        **defaults,
    )


def resolution_make(
    item: WorkItem,
    integration: Integration,
    *,
    state: str = RequestState.COMPLETED,
    outcome: str = "",
    saas_states: tuple[str, ...] = (),
) -> ResolutionRequest:
    number = next(_numbers)
    resolution = ResolutionRequest.objects.create(
        broker=item.broker,
        work_item=item,
        integration=integration,
        results_token=f"{number:064x}",
        drop_session_id=item.cycle.drop_session_id,
        match_date=item.cycle.match_date,
        state=state,
        drop_outcome=outcome,
    )
    for index, saas_state in enumerate(saas_states):
        connection = SaasConnection.objects.create(
            broker=item.broker, name=f"SaaS {number}-{index}", url="https://saas.example.com/d"
        )
        SaasDeletion.objects.create(
            resolution=resolution, saas_connection=connection, state=saas_state
        )
    return resolution


def report_file_make(
    cycle: DropCycle, items: list[WorkItem], *, kind: str = "upload"
) -> ReportFile:
    """An accepted response file holding ``items`` with their status codes."""
    taken = set(ReportFile.objects.filter(cycle=cycle).values_list("file_name", flat=True))
    name = response_name(items[0].file_name, kind=kind, taken=taken)
    built = build_response_file(name, [(i.work_item_id, i.status_code or 5) for i in items])
    report_file = ReportFile.objects.create(
        broker=cycle.broker,
        cycle=cycle,
        kind=kind,
        file_name=name,
        rows=built.rows,
        sha256=built.sha256,
        content=built.content,
        state="accepted",
        uploaded_at=timezone.now(),
    )
    prior: dict[str, Any] = {}
    if kind == "amend":  # what DROP held before, as reporting keeps it
        prior = {
            "prior_reported_status_code": F("reported_status_code"),
            "prior_reported_at": F("reported_at"),
            "prior_report_file": F("report_file"),
        }
    WorkItem.objects.filter(pk__in=[i.pk for i in items]).update(
        state=WorkItemState.REPORTED,
        reported_status_code=F("status_code"),
        reported_at=timezone.now(),
        report_file=report_file,
        **prior,
    )
    return report_file


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


@dataclass
class OutcomeHistory:
    deleted: DeletionRequest  # attempted twice, acknowledged, completed, reported
    failed: DeletionRequest  # carries formula-looking text
    amended: DeletionRequest  # a late match whose status went out as an amendment
    other_broker: DeletionRequest


def outcome_history(broker: Broker, other: Broker) -> OutcomeHistory:
    """Four deletion requests, three of ``broker``'s and one of ``other``'s."""
    integration = integration_make(broker)
    cycle = cycle_make(broker)
    first = item_make(cycle, status_code=3, work_item_id="A1b2C3d4E5f6")
    deleted = request_make(
        first,
        outcome="deleted",
        integration=integration,
        matched_at=at("2026-03-12T10:00:00"),
        dispatched_at=at("2026-03-12T10:05:00"),
        completed_at=at("2026-03-13T08:00:00"),
        attempts=2,
    )
    for number, (started, status) in enumerate(
        [("2026-03-12T10:00:05", 500), ("2026-03-12T10:05:00", 200)], start=1
    ):
        DeliveryAttempt.objects.create(
            deletion_request=deleted,
            number=number,
            started_at=at(started),
            url=integration.url,
            status=status,
        )
    report_file_make(cycle, [first])
    second = item_make(cycle, list_type="Phone")
    failed = request_make(
        second,
        outcome="failed",
        integration=integration,
        remote_identifier="@crm:user-7",
        error_message='=HYPERLINK("http://evil.example")',
        matched_at=at("2026-03-13T10:00:00"),
    )
    third = item_make(cycle, status_code=3, work_item_id="Late0Match01")
    amended = request_make(
        third,
        outcome="deleted",
        integration=integration,
        late_match=True,
        remote_identifier="C-late",
        matched_at=at("2026-04-02T10:00:00"),
    )
    report_file_make(cycle, [third], kind="amend")
    other_cycle = cycle_make(other)
    other_request = request_make(
        item_make(other_cycle), outcome="not_found", matched_at=at("2026-03-12T10:00:00")
    )
    return OutcomeHistory(deleted, failed, amended, other_request)
