"""Rows for tests, written straight to the tables (no matching, no dispatch), so a test states
exactly the situation it needs; and DROP packages from the loopback DROP stand-in.

The factory_boy factories hold each model's defaults once; the short functions below are what
tests call, each keeping the values its tests were written against::

    cycle = cycle_make(broker)                                  # reporting: March, 45 days
    item = item_make(cycle, list_type="Email", status_code=5)
    request_make(item, outcome="deleted")

    created = webhook_integration_for(broker, simulator.url)    # through the service: a test
    request = deletion_request(created.integration)              # holds its Webhook Secret

    created = isi_integration_for(broker, api)                  # OAuth, connections listed
    request = isi_deletion_request(connection_of(created, CONNECTION_A), remote_identifier="C-1")

    items = list(work_items(4))                                  # a DROP package
    consumer(broker, "C-1", email=items[0][1])
    package = drop_zip(broker, {"Email": items[:2], "Phone": items[2:]})

    world = sample_cycle(broker, today=date(2026, 3, 20))        # every model of a cycle
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import secrets
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import factory
from django.db import connection
from django.db.models import F
from django.utils import timezone
from factory.django import DjangoModelFactory
from procrastinate.contrib.django import app

from devtools.drop_simulator import build_drop_zip
from devtools.isi_simulator import IsiSimulator
from devtools.isi_simulator import connection as listed_connection
from integrations.drop.notifications import notification_signature, notification_timestamp
from integrations.drop.reporting import build_response_file, response_name
from integrations.models import (
    DROP_CAPABILITIES,
    DROP_STATUS_CODES,
    Broker,
    Consumer,
    ConsumerHash,
    DeletionRequest,
    DeliveryAttempt,
    DropCycle,
    Integration,
    IntegrationKind,
    IsiConnection,
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
from integrations.services.integrations import CreatedIntegration, webhook_integration_create
from integrations.services.isi import CreatedIsiIntegration, isi_integration_create

MATCH_DATE = dt.date(2026, 11, 20)  # the webhook and ISI tests' cycle
DAY = dt.date(2026, 3, 12)  # the reporting tests' cycle
PACKAGE_DATE = "20261120"
HASH_TYPES = {"Email": "email", "Phone": "phone", "NDZ": "ndz", "MAID": "maid"}
IDENTIFIER_HASH = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="

CONNECTION_A = "7d2c0f43-1f1e-4f27-9d5e-2b8f3a3f0c11"
CONNECTION_B = "0b9a52d4-58c5-4c3e-8a3c-6f4f2d1c9e21"
CONNECTION_STANDARD = "c4e1f0aa-3b7d-4a55-9b8e-0d2f6a7c8b33"  # privacy/access, privacy/delete


# The factories: one per model, its defaults in one place.


class DropCycleFactory(DjangoModelFactory[DropCycle]):
    class Meta:
        model = DropCycle

    drop_session_id = "1"
    match_date = MATCH_DATE
    downloaded_at = factory.LazyAttribute(
        lambda o: dt.datetime.combine(o.match_date, dt.time(9), tzinfo=dt.UTC)
    )
    zip_name = factory.LazyAttribute(
        lambda o: f"{o.match_date:%Y%m%d}_{o.broker.broker_id}_DROP.zip"
    )
    zip_sha256 = factory.LazyAttribute(
        lambda o: hashlib.sha256(f"{o.broker.pk}:{o.drop_session_id}".encode()).hexdigest()
    )
    due_date = factory.LazyAttribute(lambda o: o.match_date + dt.timedelta(days=45))


class WorkItemFactory(DjangoModelFactory[WorkItem]):
    """A work item of ``cycle``; its id and hash are unique in the test run."""

    class Meta:
        model = WorkItem

    class Params:
        list_type = "Email"

    broker = factory.SelfAttribute("cycle.broker")
    work_item_id = factory.Sequence(lambda n: f"W{n + 1:011d}")
    hash_type = factory.LazyAttribute(lambda o: HASH_TYPES[o.list_type])
    hash = factory.Sequence(lambda n: hashlib.sha256(f"item-{n + 1}".encode()).digest())
    file_name = factory.LazyAttribute(
        lambda o: f"{o.cycle.match_date:%Y%m%d}_{o.cycle.broker.broker_id}_{o.list_type}.csv"
    )


class WebhookIntegrationFactory(DjangoModelFactory[Integration]):
    class Meta:
        model = Integration

    kind = IntegrationKind.WEBHOOK
    name = "Acme CRM"
    url = "https://hooks.example.com/drop"
    webhook_secret = "whsec_" + "A" * 43


class ConsumerFactory(DjangoModelFactory[Consumer]):
    class Meta:
        model = Consumer

    remote_identifier = factory.Sequence(lambda n: f"C-{n + 1}")
    remote_identifier_kind = "external_id"


class DeletionRequestFactory(DjangoModelFactory[DeletionRequest]):
    """A deletion request for ``work_item``, as matching writes it."""

    class Meta:
        model = DeletionRequest

    broker = factory.SelfAttribute("work_item.broker")
    integration = None
    state = RequestState.QUEUED
    identifier_hash = IDENTIFIER_HASH
    hash_type = factory.SelfAttribute("work_item.hash_type")
    drop_session_id = factory.SelfAttribute("work_item.cycle.drop_session_id")
    match_date = factory.SelfAttribute("work_item.cycle.match_date")
    broker_id_code = factory.SelfAttribute("broker.broker_id")
    mode = factory.SelfAttribute("broker.mode")
    remote_identifier = "C-1"
    remote_identifier_kind = factory.LazyAttribute(
        lambda o: "external_id" if o.remote_identifier else ""
    )


class ResolutionRequestFactory(DjangoModelFactory[ResolutionRequest]):
    """An identifier retrieval notification for ``work_item``, through ``integration``."""

    class Meta:
        model = ResolutionRequest

    broker = factory.SelfAttribute("work_item.broker")
    state = RequestState.QUEUED
    results_token = factory.LazyFunction(lambda: secrets.token_hex(32))
    drop_session_id = factory.SelfAttribute("work_item.cycle.drop_session_id")
    match_date = factory.SelfAttribute("work_item.cycle.match_date")
    remote_identifier = "C-1"
    remote_identifier_kind = factory.LazyAttribute(
        lambda o: "external_id" if o.remote_identifier else ""
    )


class SaasConnectionFactory(DjangoModelFactory[SaasConnection]):
    class Meta:
        model = SaasConnection

    name = factory.Sequence(lambda n: f"SaaS {n + 1}")
    url = "https://saas.example.com/d"


class SaasDeletionFactory(DjangoModelFactory[SaasDeletion]):
    class Meta:
        model = SaasDeletion

    state = RequestState.QUEUED


# Webhook and ISI tests: a cycle of November 20, downloaded now; integrations through their
# services.


def webhook_integration_for(broker: Broker, url: str, name: str = "Acme CRM") -> CreatedIntegration:
    return webhook_integration_create(broker=broker, name=name, url=url, actor="test")


def cycle(broker: Broker, session: str = "1") -> DropCycle:
    found = DropCycle.objects.filter(broker=broker, drop_session_id=session).first()
    return found or DropCycleFactory.create(
        broker=broker, drop_session_id=session, downloaded_at=timezone.now()
    )


def work_item(broker: Broker, session: str = "1") -> WorkItem:
    return WorkItemFactory.create(cycle=cycle(broker, session))


def deletion_request(
    integration: Integration | None, *, broker: Broker | None = None, **fields: Any
) -> DeletionRequest:
    broker = broker or (integration.broker if integration else None)
    assert broker is not None
    fields.setdefault("work_item", None)
    fields["work_item"] = fields["work_item"] or work_item(broker)
    return DeletionRequestFactory.create(integration=integration, **fields)


def resolution_request(integration: Integration, **fields: Any) -> ResolutionRequest:
    fields["work_item"] = fields.get("work_item") or work_item(integration.broker)
    return ResolutionRequestFactory.create(integration=integration, **fields)


def saas_connection(broker: Broker, url: str, **fields: Any) -> SaasConnection:
    fields.setdefault("identifier_categories", ["email"])
    fields.setdefault("name", "Mailer")
    return SaasConnectionFactory.create(broker=broker, url=url, **fields)


def saas_deletion(
    resolution: ResolutionRequest, connection_: SaasConnection, **fields: Any
) -> SaasDeletion:
    return SaasDeletionFactory.create(resolution=resolution, saas_connection=connection_, **fields)


def broker_connections() -> list[dict[str, Any]]:
    """Two connections taking part in DROP and one with only the standard capabilities."""
    return [
        listed_connection(CONNECTION_A),
        listed_connection(CONNECTION_B),
        listed_connection(CONNECTION_STANDARD, ["privacy/access", "privacy/delete"]),
    ]


def isi_integration_for(
    broker: Broker, api: IsiSimulator, *, oauth: bool = True, name: str = "Acme API"
) -> CreatedIsiIntegration:
    credentials = (
        {"token_url": api.token_url, "client_id": api.client_id, "client_secret": api.client_secret}
        if oauth
        else {"token": api.token or ""}
    )
    return isi_integration_create(
        broker=broker, name=name, base_url=api.base_url, actor="test", **credentials
    )


def connection_of(created: CreatedIsiIntegration, uuid: str) -> IsiConnection:
    return IsiConnection.objects.get(integration=created.integration, uuid=uuid)


def isi_deletion_request(isi_connection: IsiConnection, **fields: Any) -> DeletionRequest:
    integration = isi_connection.integration
    fields["work_item"] = fields.get("work_item") or work_item(integration.broker)
    fields.setdefault("remote_identifier_kind", "external_id")
    return DeletionRequestFactory.create(
        integration=integration,
        isi_connection=isi_connection,
        results_token=secrets.token_hex(32),
        **fields,
    )


def isi_resolution_request(isi_connection: IsiConnection, **fields: Any) -> ResolutionRequest:
    integration = isi_connection.integration
    fields["work_item"] = fields.get("work_item") or work_item(integration.broker)
    fields.setdefault("remote_identifier_kind", "external_id")
    return ResolutionRequestFactory.create(
        integration=integration, isi_connection=isi_connection, **fields
    )


def jobs_truncate() -> None:
    """Empty Procrastinate's tables, which Django does not flush after a transactional test."""
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_periodic_defers, "
            "procrastinate_workers CASCADE"
        )


def truncate_jobs() -> Iterator[None]:
    """For transactional tests: no job of an earlier test, and none left for a later one."""
    jobs_truncate()
    yield
    jobs_truncate()


def worker_jobs_emptied() -> Iterator[None]:
    """``truncate_jobs``, then close the connections an in-process worker's job threads keep
    (CONN_MAX_AGE), so the test database can be dropped at the end of the run."""
    yield from truncate_jobs()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def run_worker(queues: list[str] | None = None) -> None:
    """Run a real worker (its own connection, as ``manage.py worker``) until the queues are
    empty (all queues by default)."""
    with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
        app.run_worker(
            queues=queues, wait=False, install_signal_handlers=False, listen_notify=False
        )


# DROP cycle tests: consumers and deletion targets, and packages from the loopback DROP
# stand-in's ``build_drop_zip``.


def consumer(broker: Broker, remote_identifier: str, **hashes: str | list[str]) -> Consumer:
    """A registered consumer with Base64 hashes by list type (``email=...``, ``ndz=[...]``)."""
    registered = ConsumerFactory.create(broker=broker, remote_identifier=remote_identifier)
    for hash_type, values in hashes.items():
        for value in [values] if isinstance(values, str) else values:
            ConsumerHash.objects.create(
                consumer=registered,
                broker=broker,
                hash_type=hash_type,
                hash=base64.b64decode(value),
            )
    return registered


def webhook(broker: Broker, name: str = "Main webhook", *, enabled: bool = True) -> Integration:
    return WebhookIntegrationFactory.create(
        broker=broker,
        name=name,
        enabled=enabled,
        url="https://broker.example/drop",
        webhook_secret="whsec_" + "a" * 43,
    )


def isi_connection(
    broker: Broker,
    *,
    capabilities: Iterable[str] = DROP_CAPABILITIES,
    listed: bool = True,
    enabled: bool = True,
) -> IsiConnection:
    integration = Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.ISI,
        name="Broker API",
        enabled=enabled,
        base_url="https://api.broker.example",
        auth="token",
        token="t0ken",
        webhook_secret="whsec_" + "b" * 43,
    )
    return IsiConnection.objects.create(
        integration=integration,
        uuid=CONNECTION_A,
        capabilities=list(capabilities),
        listed=listed,
        refreshed_at=timezone.now(),
    )


def drop_zip(
    broker: Broker,
    lists: Mapping[str, Iterable[tuple[str, str]]],
    removed: Iterable[tuple[str, str, str]] | None = None,
    *,
    date: str = PACKAGE_DATE,
) -> bytes:
    return build_drop_zip(broker.broker_id, date, lists, removed)


def write_zip(directory: Path, content: bytes, name: str = f"{PACKAGE_DATE}_4821_DROP.zip") -> Path:
    path = directory / name
    path.write_bytes(content)
    return path


def days_after(date: str, days: int) -> dt.date:
    return dt.datetime.strptime(date, "%Y%m%d").date() + dt.timedelta(days=days)


# Reporting tests: a cycle of March 12, work items with status codes, requests with outcomes.


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
    return DropCycleFactory.create(
        broker=broker,
        drop_session_id=session,
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
    if state is None:
        state = WorkItemState.OPEN if status_code is None else WorkItemState.REPORTABLE
    if work_item_id:
        fields["work_item_id"] = work_item_id
    return WorkItemFactory.create(
        cycle=cycle, list_type=list_type, state=state, status_code=status_code, **fields
    )


def integration_make(broker: Broker, name: str = "Acme CRM") -> Integration:
    return WebhookIntegrationFactory.create(broker=broker, name=name)


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
    return DeletionRequestFactory.create(
        work_item=item,
        consumer=consumer,
        integration=integration,
        identifier_hash="A" * 43 + "=",
        remote_identifier=remote_identifier,
        remote_identifier_kind="",
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
    resolution = ResolutionRequestFactory.create(
        work_item=item,
        integration=integration,
        state=state,
        drop_outcome=outcome,
        remote_identifier="",
    )
    for saas_state in saas_states:
        SaasDeletionFactory.create(
            resolution=resolution,
            saas_connection=SaasConnectionFactory.create(broker=item.broker),
            state=saas_state,
        )
    return resolution


def report_file_make(
    cycle: DropCycle, items: list[WorkItem], *, kind: str = "upload", state: str = "accepted"
) -> ReportFile:
    """A response file holding ``items`` with their status codes: accepted (DROP holds them,
    as when DROP takes a file), or another ``state`` (written, refused, rejected: the items
    wait with it and DROP holds what it held)."""
    taken = set(ReportFile.objects.filter(cycle=cycle).values_list("file_name", flat=True))
    name = response_name(items[0].file_name, kind=kind, taken=taken)
    built = build_response_file(name, [(i.work_item_id, i.status_code or 5) for i in items])
    taken_by_drop = state in ("accepted", "manual")
    report_file = ReportFile.objects.create(
        broker=cycle.broker,
        cycle=cycle,
        kind=kind,
        file_name=name,
        rows=built.rows,
        sha256=built.sha256,
        content=built.content,
        state=state,
        uploaded_at=timezone.now() if taken_by_drop else None,
    )
    rows = WorkItem.objects.filter(pk__in=[i.pk for i in items])
    if taken_by_drop:
        rows.update(
            state=WorkItemState.REPORTED,
            reported_status_code=F("status_code"),
            reported_at=timezone.now(),
            report_file=report_file,
            pending_report_file=None,
            pending_status_code=None,
            needs_amendment=False,
        )
    else:
        rows.update(
            state=WorkItemState.REPORTABLE,
            pending_report_file=report_file,
            pending_status_code=F("status_code"),
        )
    return report_file


DROP_WEBHOOK_SECRET = "whsec_" + "k" * 43  # the test broker's, as DROP's portal shows it


def drop_notification_post(
    client: Any,
    event_type: str,
    *,
    event_id: str | None = None,
    message: str = "download ready",
    secret: str = DROP_WEBHOOK_SECRET,
    sent_at: dt.datetime | None = None,
    url: str = "/api/v1/drop/notifications/4821",
) -> Any:
    """POST a notification as DROP does: the raw body signed with the timestamp, every header."""
    body = json.dumps({"message": message}).encode()
    timestamp = notification_timestamp(sent_at or timezone.now())
    return client.post(
        url,
        body,
        content_type="application/json",
        HTTP_X_WEBHOOK_EVENT_ID=event_id or str(uuid.uuid4()),
        HTTP_X_WEBHOOK_EVENT_TYPE=event_type,
        HTTP_X_WEBHOOK_DELIVERY_ID=str(uuid.uuid4()),
        HTTP_X_WEBHOOK_TIMESTAMP=timestamp,
        HTTP_X_WEBHOOK_VERSION="1.0",
        HTTP_X_WEBHOOK_SIGNATURE=notification_signature(secret, timestamp, body),
    )


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


# Admin and dashboard tests: a broker part-way through DROP cycles, every model of the cycle
# with rows in known numbers.

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


def _sample_cycle(
    broker: Broker, session: str, downloaded: dt.datetime, **fields: object
) -> DropCycle:
    return DropCycleFactory.create(
        broker=broker,
        drop_session_id=session,
        downloaded_at=downloaded,
        match_date=downloaded.date(),
        **fields,
    )


def _sample_items(cycle: DropCycle, spec: dict[tuple[str, int | None], int]) -> list[WorkItem]:
    return [
        WorkItemFactory.create(cycle=cycle, state=state, status_code=status_code)
        for (state, status_code), n in spec.items()
        for _ in range(n)
    ]


def sample_cycle(broker: Broker, *, today: dt.date) -> SampleCycle:
    """Cycle "1" reported (uploaded), cycle "2" open since 10 days before ``today``."""
    noon = dt.time(12, tzinfo=dt.UTC)
    previous = _sample_cycle(
        broker,
        "1",
        dt.datetime.combine(today - dt.timedelta(days=60), noon),
        state="reported",
        work_items=16,
    )
    cycle = _sample_cycle(
        broker, "2", dt.datetime.combine(today - dt.timedelta(days=10), noon), work_items=15
    )
    _sample_items(previous, PREVIOUS_ITEMS)
    open_items = _sample_items(cycle, CURRENT_ITEMS)
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
    integration = WebhookIntegrationFactory.create(broker=broker, name="Acme deletions")
    consumer = ConsumerFactory.create(broker=broker, remote_identifier="C-1")
    ConsumerHash.objects.create(
        consumer=consumer, broker=broker, hash_type="email", hash=hashlib.sha256(b"C-1").digest()
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
        world.requests[name] = DeletionRequestFactory.create(
            work_item=item,
            consumer=consumer,
            integration=integration,
            identifier_hash="A" * 43 + "=",
            remote_identifier_kind="",
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
    saas = SaasConnectionFactory.create(
        broker=broker, name="Mailer", url="https://api.mailer.example/erase", token="tok"
    )
    for n, (state, identifiers) in enumerate(
        [(RequestState.DISPATCHED, ""), (RequestState.COMPLETED, '{"email":[{"email":"a@x.com"}]}')]
    ):
        resolution = ResolutionRequestFactory.create(
            work_item=open_items[n],
            consumer=consumer,
            integration=integration,
            remote_identifier_kind="",
            state=state,
            dispatched_at=now - dt.timedelta(days=1),
            identifiers=identifiers,
        )
    SaasDeletionFactory.create(
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
