"""Rows for tests, written straight to the tables (no matching, no dispatch), so a test states
exactly the situation it needs; and DROP packages from the loopback DROP stand-in.

One vocabulary: a factory_boy factory per model, its defaults in one place and a trait per
situation; the few functions below do what a factory cannot (a service's shown-once secret,
a report file and what DROP's answer does to its items, a ZIP, a worker)::

    cycle = DropCycleFactory(broker=broker)                     # reporting: March, 45 days
    item = WorkItemFactory(cycle=cycle, list_type="Email", status_code=5)
    DeletionRequestFactory(work_item=item, drop_outcome="deleted")
    items_reported(cycle, [item])                               # DROP took the file

    created = webhook_integration_created(broker, simulator.url)  # through the service: a
    request = DeletionRequestFactory(integration=created.integration)  # test holds its secret

    created = isi_integration_created(broker, api)              # OAuth, connections listed
    connection_a = created.integration.connections.get(uuid=CONNECTION_A)
    request = DeletionRequestFactory(isi_connection=connection_a, remote_identifier="C-1")

    items = list(work_items(4))                                  # a DROP package
    ConsumerFactory(broker=broker, remote_identifier="C-1", hashes={"email": items[0][1]})
    package = drop_zip(broker, {"Email": items[:2], "Phone": items[2:]})

    world = sample_cycle(broker, today=date(2026, 3, 20))        # every model of a cycle
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import json
import secrets
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import factory
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from factory.django import DjangoModelFactory
from procrastinate import PsycopgConnector
from procrastinate.contrib.django import app
from procrastinate.contrib.django.settings import settings as procrastinate_settings
from procrastinate.contrib.django.utils import connector_params
from procrastinate.periodic import PeriodicRegistry

from devtools.drop_simulator import DropSimulator, build_drop_zip
from devtools.isi_simulator import IsiSimulator
from devtools.isi_simulator import connection as listed_connection
from integrations.drop.calendar import drop_date, drop_timezone, drop_today
from integrations.drop.notifications import notification_signature, notification_timestamp
from integrations.drop.reporting import build_response_file, response_name
from integrations.models import (
    DROP_CAPABILITIES,
    DROP_STATUS_CODES,
    Broker,
    Canary,
    Consumer,
    ConsumerHash,
    DeletionRequest,
    DeliveryAttempt,
    Directive,
    DirectiveReason,
    DropAccessObligation,
    DropCycle,
    DropOutage,
    Integration,
    IntegrationKind,
    IsiConnection,
    LedgerAnchor,
    LedgerChainLink,
    OptOutRecord,
    Reappearance,
    ReportFile,
    ReportFileState,
    ReportKind,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    ServiceProvider,
    UnreadableWorkItem,
    WorkItem,
    WorkItemState,
)
from integrations.services.ledger import ledger_seal
from integrations.services.staff.integrations import CreatedIntegration, webhook_integration_create
from integrations.services.staff.isi import CreatedIsiIntegration, isi_integration_create

MATCH_DATE = dt.date(2026, 11, 20)  # the webhook and ISI tests' cycle
DAY = dt.date(2026, 3, 12)  # the reporting tests' cycle
PACKAGE_DATE = "20261120"
HASH_TYPES = {"Email": "email", "Phone": "phone", "NDZ": "ndz", "MAID": "maid"}
IDENTIFIER_HASH = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="

CONNECTION_A = "7d2c0f43-1f1e-4f27-9d5e-2b8f3a3f0c11"
CONNECTION_B = "0b9a52d4-58c5-4c3e-8a3c-6f4f2d1c9e21"
CONNECTION_STANDARD = "c4e1f0aa-3b7d-4a55-9b8e-0d2f6a7c8b33"  # privacy/access, privacy/delete


# The factories: one per model, its defaults in one place, a trait for each situation tests
# start from.


class BrokerFactory(DjangoModelFactory[Broker]):
    """A broker written straight to the table (``broker_create`` also ledgers it: the
    ``broker`` fixture goes through it)."""

    class Meta:
        model = Broker

    broker_id = factory.Sequence(lambda n: f"{9000 + n}")
    name = factory.LazyAttribute(lambda o: f"Broker {o.broker_id}")
    mode = "test"


class DropCycleFactory(DjangoModelFactory[DropCycle]):
    """A cycle downloaded on ``match_date`` (the reporting tests' March 12), due
    ``due_in_days`` later."""

    class Meta:
        model = DropCycle

    class Params:
        due_in_days = 45

    broker = factory.SubFactory(BrokerFactory)
    drop_session_id = "1"
    match_date = DAY
    downloaded_at = factory.LazyAttribute(
        lambda o: dt.datetime.combine(o.match_date, dt.time(9), tzinfo=dt.UTC)
    )
    zip_name = factory.LazyAttribute(
        lambda o: f"{o.match_date:%Y%m%d}_{o.broker.broker_id}_DROP.zip"
    )
    zip_sha256 = factory.LazyAttribute(
        lambda o: hashlib.sha256(f"{o.broker.pk}:{o.drop_session_id}".encode()).hexdigest()
    )
    due_date = factory.LazyAttribute(lambda o: o.match_date + dt.timedelta(days=o.due_in_days))
    # A production cycle unless a test says otherwise, whatever its broker's mode now (as
    # for a broker switched to test since): the yearly figures count these only.
    mode = "production"


class CurrentCycleFactory(DropCycleFactory):
    """The webhook and ISI tests' cycle: November 20, downloaded now; one per broker and
    session, so every work item made without a cycle shares it."""

    class Meta:
        django_get_or_create = ("broker", "drop_session_id")

    match_date = MATCH_DATE
    downloaded_at = factory.LazyAttribute(lambda o: timezone.now())


class WorkItemFactory(DjangoModelFactory[WorkItem]):
    """A work item; its id and hash are unique in the test run. Open, or reportable once it
    has a ``status_code``; ``reported=True``: DROP holds that status."""

    class Meta:
        model = WorkItem

    class Params:
        list_type = "Email"
        reported = factory.Trait(
            state=WorkItemState.REPORTED,
            status_code=5,
            reported_status_code=factory.SelfAttribute("status_code"),
            reported_at=factory.LazyFunction(timezone.now),
        )

    cycle = factory.SubFactory(CurrentCycleFactory)
    broker = factory.SelfAttribute("cycle.broker")
    work_item_id = factory.Sequence(lambda n: f"W{n + 1:011d}")
    hash_type = factory.LazyAttribute(lambda o: HASH_TYPES[o.list_type])
    hash = factory.Sequence(lambda n: hashlib.sha256(f"item-{n + 1}".encode()).digest())
    file_name = factory.LazyAttribute(
        lambda o: f"{o.cycle.match_date:%Y%m%d}_{o.cycle.broker.broker_id}_{o.list_type}.csv"
    )
    status_code = None
    state = factory.LazyAttribute(
        lambda o: WorkItemState.OPEN if o.status_code is None else WorkItemState.REPORTABLE
    )
    reported_at = None
    first_reported_at = factory.SelfAttribute("reported_at")  # no amendment taken since


class UnreadableWorkItemFactory(DjangoModelFactory[UnreadableWorkItem]):
    class Meta:
        model = UnreadableWorkItem

    broker = factory.SelfAttribute("cycle.broker")


class WebhookIntegrationFactory(DjangoModelFactory[Integration]):
    """A webhook integration written straight to the table, its secret known to no one (a test
    that signs as the broker goes through the service: ``webhook_integration_created``)."""

    class Meta:
        model = Integration

    broker = factory.SubFactory(BrokerFactory)
    kind = IntegrationKind.WEBHOOK
    name = "Acme CRM"
    url = "https://hooks.example.com/drop"
    webhook_secret = "whsec_" + "A" * 43


class IsiIntegrationFactory(DjangoModelFactory[Integration]):
    """An ISI integration with a static token, written straight to the table."""

    class Meta:
        model = Integration

    broker = factory.SubFactory(BrokerFactory)
    kind = IntegrationKind.ISI
    name = "Broker API"
    base_url = "https://api.broker.example"
    auth = "token"
    token = "t0ken"
    webhook_secret = "whsec_" + "b" * 43


# A factory for each kind of integration (``IntegrationKind``): tests that walk every kind's
# admin (tests/admin/test_actions_ledger.py) make a row of a kind the sample cycle lacks.
INTEGRATION_FACTORIES: dict[str, type[DjangoModelFactory[Integration]]] = {
    IntegrationKind.WEBHOOK: WebhookIntegrationFactory,
    IntegrationKind.ISI: IsiIntegrationFactory,
}


class IsiConnectionFactory(DjangoModelFactory[IsiConnection]):
    """Connection A of an ISI integration, taking part in DROP."""

    class Meta:
        model = IsiConnection

    integration = factory.SubFactory(IsiIntegrationFactory)
    uuid = CONNECTION_A
    capabilities = factory.LazyFunction(lambda: list(DROP_CAPABILITIES))
    listed = True
    refreshed_at = factory.LazyFunction(timezone.now)


class ConsumerFactory(DjangoModelFactory[Consumer]):
    """A registered consumer; ``hashes``: its Base64 hashes by type (``{"email": h}``, a list
    for several)."""

    class Meta:
        model = Consumer
        skip_postgeneration_save = True

    broker = factory.SubFactory(BrokerFactory)
    remote_identifier = factory.Sequence(lambda n: f"C-{n + 1}")
    remote_identifier_kind = "external_id"

    @factory.post_generation
    def hashes(self, create: bool, extracted: Mapping[str, str | list[str]] | None) -> None:
        for hash_type, values in (extracted or {}).items():
            for value in [values] if isinstance(values, str) else values:
                ConsumerHashFactory.create(
                    consumer=self, hash_type=hash_type, hash=base64.b64decode(value)
                )


class CanaryFactory(DjangoModelFactory[Canary]):
    """A canary named by staff: a consumer of the broker's, by its ``remote_identifier``."""

    class Meta:
        model = Canary

    broker = factory.SubFactory(BrokerFactory)
    remote_identifier = "TEST-1"
    added_by = "test"


class ConsumerHashFactory(DjangoModelFactory[ConsumerHash]):
    class Meta:
        model = ConsumerHash

    broker = factory.SelfAttribute("consumer.broker")
    hash_type = "email"


def _now_once_sent(o: Any) -> dt.datetime | None:
    sent = (RequestState.DISPATCHED, RequestState.COMPLETED, RequestState.FAILED)
    return timezone.now() if o.state in sent else None


class DeletionRequestFactory(DjangoModelFactory[DeletionRequest]):
    """A deletion request as matching writes it: for a work item of the integration's
    broker (of ``isi_connection``'s for ISI), queued. With a ``drop_outcome`` it is
    completed (``failed`` as recorded), with its code; ``dispatched=True``,
    ``completed=True`` (deleted) and ``failed=True`` say where it is."""

    class Meta:
        model = DeletionRequest

    class Params:
        dispatched = factory.Trait(state=RequestState.DISPATCHED)
        completed = factory.Trait(drop_outcome="deleted")
        failed = factory.Trait(drop_outcome="failed", error_message="CRM timeout")

    isi_connection = None
    integration = factory.Maybe(
        "isi_connection",
        yes_declaration=factory.SelfAttribute("isi_connection.integration"),
        no_declaration=None,
    )
    work_item = factory.Maybe(
        "integration",
        yes_declaration=factory.SubFactory(
            WorkItemFactory, cycle__broker=factory.SelfAttribute("...integration.broker")
        ),
        no_declaration=factory.SubFactory(WorkItemFactory),
    )
    broker = factory.SelfAttribute("work_item.broker")
    drop_outcome = ""
    state = factory.LazyAttribute(
        lambda o: (
            RequestState.FAILED
            if o.drop_outcome == "failed"
            else RequestState.COMPLETED
            if o.drop_outcome
            else RequestState.QUEUED
        )
    )
    dispatched_at = factory.LazyAttribute(_now_once_sent)
    completed_at = factory.LazyAttribute(lambda o: timezone.now() if o.drop_outcome else None)
    drop_status_code = factory.LazyAttribute(lambda o: DROP_STATUS_CODES.get(o.drop_outcome))
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
    results_token = factory.Maybe(
        "isi_connection",
        yes_declaration=factory.LazyFunction(lambda: secrets.token_hex(32)),
        no_declaration=None,
    )


class DeliveryAttemptFactory(DjangoModelFactory[DeliveryAttempt]):
    class Meta:
        model = DeliveryAttempt

    number = 1
    started_at = factory.LazyFunction(timezone.now)
    url = factory.LazyAttribute(lambda o: o.deletion_request.integration.url)


class SaasConnectionFactory(DjangoModelFactory[SaasConnection]):
    class Meta:
        model = SaasConnection

    broker = factory.SubFactory(BrokerFactory)
    name = "Mailer"
    url = "https://api.mailer.example/erase"
    identifier_categories = factory.LazyFunction(lambda: ["email"])


class SaasDeletionFactory(DjangoModelFactory[SaasDeletion]):
    class Meta:
        model = SaasDeletion

    saas_connection = factory.SubFactory(
        SaasConnectionFactory, broker=factory.SelfAttribute("..resolution.broker")
    )
    state = RequestState.QUEUED


class ResolutionRequestFactory(DjangoModelFactory[ResolutionRequest]):
    """An identifier retrieval notification for a work item of the integration's broker (of
    ``isi_connection``'s for ISI), queued; ``completed=True``: answered; ``resolved=True``:
    answered with an email to delete, ``<work_item_id>@example.com``. ``saas_deletions``:
    the states of SaaS deletions it started, one SaaS connection each."""

    class Meta:
        model = ResolutionRequest
        skip_postgeneration_save = True

    class Params:
        completed = factory.Trait(state=RequestState.COMPLETED)
        resolved = factory.Trait(
            state=RequestState.COMPLETED,
            identifiers=factory.LazyAttribute(
                lambda o: json.dumps(
                    {"email": [{"email": f"{o.work_item.work_item_id}@example.com"}]}
                )
            ),
        )

    isi_connection = None
    integration = factory.Maybe(
        "isi_connection",
        yes_declaration=factory.SelfAttribute("isi_connection.integration"),
        no_declaration=factory.SubFactory(WebhookIntegrationFactory),
    )
    work_item = factory.SubFactory(
        WorkItemFactory, cycle__broker=factory.SelfAttribute("...integration.broker")
    )
    broker = factory.SelfAttribute("work_item.broker")
    state = RequestState.QUEUED
    results_token = factory.LazyFunction(lambda: secrets.token_hex(32))
    drop_session_id = factory.SelfAttribute("work_item.cycle.drop_session_id")
    match_date = factory.SelfAttribute("work_item.cycle.match_date")
    broker_id_code = factory.SelfAttribute("broker.broker_id")
    mode = factory.SelfAttribute("broker.mode")
    remote_identifier = "C-1"
    remote_identifier_kind = factory.LazyAttribute(
        lambda o: "external_id" if o.remote_identifier else ""
    )

    @factory.post_generation
    def saas_deletions(self, create: bool, extracted: Iterable[str] | None) -> None:
        for state in extracted or ():
            SaasDeletionFactory.create(resolution=self, state=state)


class OptOutRecordFactory(DjangoModelFactory[OptOutRecord]):
    class Meta:
        model = OptOutRecord

    deletion_request = None
    resolution_request = None
    broker = factory.Maybe(
        "deletion_request",
        yes_declaration=factory.SelfAttribute("deletion_request.broker"),
        no_declaration=factory.SelfAttribute("resolution_request.broker"),
    )
    email = "Opted.Out@Example.com"


class ReappearanceFactory(DjangoModelFactory[Reappearance]):
    """A consumer registered again, from a file, after an earlier consumer matched the item."""

    class Meta:
        model = Reappearance

    work_item = factory.SubFactory(WorkItemFactory)
    broker = factory.SelfAttribute("work_item.broker")
    consumer = None
    remote_identifier = "S-9"
    source = "file:supplier-a.csv"
    source_sha256 = factory.LazyFunction(lambda: hashlib.sha256(b"supplier-a").hexdigest())


class ReportFileFactory(DjangoModelFactory[ReportFile]):
    """A report file of ``cycle`` as written, empty; ``items_reported`` writes one holding
    work items and marks them as DROP's answer does."""

    class Meta:
        model = ReportFile

    broker = factory.SelfAttribute("cycle.broker")
    kind = ReportKind.UPLOAD
    file_name = factory.LazyAttribute(
        lambda o: f"{o.cycle.match_date:%Y%m%d}_{o.cycle.broker.broker_id}_Email.csv"
    )
    rows = 0
    sha256 = "0" * 64
    content = b"Id,Status\r\n"


class DropOutageFactory(DjangoModelFactory[DropOutage]):
    """An outage of the automated DROP connection under way since now."""

    class Meta:
        model = DropOutage

    broker = factory.SubFactory(BrokerFactory)
    started_at = factory.LazyFunction(timezone.now)
    last_failure_at = factory.SelfAttribute("started_at")


class DropAccessObligationFactory(DjangoModelFactory[DropAccessObligation]):
    """The notice a long outage obliges, awaiting it, due 45 days after the failure; the
    outage is over (DROP answered again)."""

    class Meta:
        model = DropAccessObligation

    broker = factory.SubFactory(BrokerFactory)
    outage = factory.SubFactory(
        DropOutageFactory,
        broker=factory.SelfAttribute("..broker"),
        ended_at=factory.LazyFunction(timezone.now),
    )
    failure_started_at = factory.SelfAttribute("outage.started_at")
    # Due 45 days after the failure's day in DROP's calendar, as the service records it (in
    # the evening in California, UTC's date is already the next day's).
    due_date = factory.LazyAttribute(
        lambda o: drop_date(o.failure_started_at) + dt.timedelta(days=45)
    )


class ServiceProviderFactory(DjangoModelFactory[ServiceProvider]):
    """A service provider whose directives are downloaded (no S3 prefix)."""

    class Meta:
        model = ServiceProvider

    broker = factory.SubFactory(BrokerFactory)
    name = factory.Sequence(lambda n: f"Provider {n}")
    contact = "ops@provider.example"


class DirectiveFactory(DjangoModelFactory[Directive]):
    """A directive as stored, with one hash and a signature that is not checked (those a
    test verifies come from ``directives_issue``)."""

    class Meta:
        model = Directive

    provider = factory.SubFactory(ServiceProviderFactory)
    broker = factory.SelfAttribute("provider.broker")
    reason = DirectiveReason.MATCH
    content = f"hash_type,hash\nemail,{IDENTIFIER_HASH}\n".encode()
    sha256 = factory.LazyAttribute(lambda o: hashlib.sha256(o.content).hexdigest())
    signature = "A" * 86 + "=="
    key_fingerprint = "0" * 64
    rows = 1
    rows_by_hash_type = factory.LazyFunction(lambda: {"email": 1})


# Through the services: a test that signs as the broker holds the secret shown once.


def webhook_integration_created(
    broker: Broker, url: str, name: str = "Acme CRM"
) -> CreatedIntegration:
    return webhook_integration_create(broker=broker, name=name, url=url, actor="test")


def broker_connections() -> list[dict[str, Any]]:
    """Two connections taking part in DROP and one with only the standard capabilities."""
    return [
        listed_connection(CONNECTION_A),
        listed_connection(CONNECTION_B),
        listed_connection(CONNECTION_STANDARD, ["privacy/access", "privacy/delete"]),
    ]


def isi_integration_created(
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


def anchor_moved_to_head(anchor: LedgerAnchor) -> LedgerAnchor:
    """A forgery the checks must name: the sealed chain head's anchor holding ``anchor``'s
    token, signed over another hash (a token moved to a chain head it never saw)."""
    ledger_seal()
    head = LedgerChainLink.objects.order_by("-position").first()
    assert head is not None and head.position > anchor.position
    return LedgerAnchor.objects.create(
        position=head.position,
        event_id=head.event_id,
        chain_hash=head.chain_hash,
        token=anchor.token,
        token_sha256=anchor.token_sha256,
        tsa_url=anchor.tsa_url,
        gen_time=anchor.gen_time,
        created_at=timezone.now(),
    )


def broker_reports_to(broker: Broker, drop: DropSimulator) -> Broker:
    """``broker`` with ``drop``'s key and address, as staff set them: its statuses go there."""
    broker.drop_api_key = drop.api_key
    broker.drop_base_url = drop.url
    broker.save()
    return broker


# What migrations leave in the database besides django_migrations, in an order that deletes
# referring rows first and inserts them last.
MIGRATED_TABLES = ("auth_group_permissions", "auth_group", "auth_permission", "django_content_type")
# Those, and the migrations' own record: what ``tables_empty`` keeps.
KEPT_TABLES = ("django_migrations", *MIGRATED_TABLES)
_EMPTIED: list[str] = []  # the other tables, read from the catalog once per process


def tables_empty() -> None:
    """Every table emptied but those migrations fill (Procrastinate's too), in one round trip.

    TRUNCATE makes new files for each table, up to a second on a busy server; DELETE with
    triggers off (the ledger's append-only ones, and the foreign key checks: everything goes)
    takes a few milliseconds on tables this small.
    """
    with connection.cursor() as cursor:
        if not _EMPTIED:
            cursor.execute(
                "SELECT quote_ident(tablename) FROM pg_tables"
                " WHERE schemaname = current_schema() AND NOT tablename = ANY(%s)",
                [list(KEPT_TABLES)],
            )
            _EMPTIED.extend(sorted(name for (name,) in cursor.fetchall()))
        # The names come from the catalog, quoted by quote_ident.
        deletes = "".join(f"DELETE FROM {table}; " for table in _EMPTIED)  # noqa: S608
        cursor.execute(f"BEGIN; SET LOCAL session_replication_role = replica; {deletes}COMMIT;")


# Set by run_worker, read by worker_sessions_end (tests/conftest.py, after every test).
_WORKER_RAN = threading.Event()


def worker_sessions_end() -> None:
    """After a test that ran a worker, end the connections its job threads keep open
    (CONN_MAX_AGE), so the test database can be dropped at the end of the run. The jobs
    themselves go with every other row at a transactional test's end (``tables_empty``).
    Called for every test: a file that forgot it left sessions only when its test ran last
    on a worker, so the guard at the end of the run tripped now and then."""
    if not _WORKER_RAN.is_set():
        return
    _WORKER_RAN.clear()
    # Closed first, not terminated under it: the connection of the thread that runs this
    # process's sync_to_async calls (the Django connector's async queries), which the next
    # test's ``stalled_jobs_retry`` would find dead.
    asyncio.run(sync_to_async(connections.close_all)())
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def run_worker(queues: list[str] | None = None) -> None:
    """Run a real worker (its own connection, as ``manage.py worker``) until the queues are
    empty (all queues by default): the jobs the test queued, and only those.

    Without its periodic deferrer: a worker that starts defers every periodic job's last
    run up to a day back (``PROCRASTINATE_PERIODIC_DEFAULTS``), and with the tables emptied
    after each test, each test's first worker ran them all (a pull, the alerts' evaluation,
    drop doctor, the ledger's verify...): most of such a test's time, and work no assertion
    asked for. tests/test_jobs.py tests that deferral on its own."""
    _WORKER_RAN.set()
    # The connector ``manage.py worker`` makes, its pool opening one session rather than
    # four (psycopg_pool's default) and growing to four as the worker asks: each session is
    # a PostgreSQL backend started, and a test's worker runs for a moment.
    connector = PsycopgConnector(
        kwargs=connector_params(procrastinate_settings.DATABASE_ALIAS), min_size=1, max_size=4
    )
    # On the app itself, which ``replace_connector`` yields: ``app`` is Procrastinate's proxy
    # for Django, and an attribute set on it is the proxy's, never seen by the worker.
    with app.replace_connector(connector) as real:
        registry, real.periodic_registry = real.periodic_registry, PeriodicRegistry()
        try:
            real.run_worker(
                queues=queues, wait=False, install_signal_handlers=False, listen_notify=False
            )
        finally:
            real.periodic_registry = registry


# DROP packages from the loopback DROP stand-in's ``build_drop_zip``.


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


def broker_in_production(broker: Broker) -> Broker:
    """``broker`` switched to production mode, as staff do: the cycles it downloads from
    then on count in the yearly figures."""
    broker.mode = "production"
    broker.save(update_fields=["mode"])
    return broker


def days_after(date: str, days: int) -> dt.date:
    return dt.datetime.strptime(date, "%Y%m%d").date() + dt.timedelta(days=days)


# Reporting tests: report files DROP took (or not) for work items.


def items_reported(
    cycle: DropCycle, items: list[WorkItem], *, kind: str = "upload", state: str = "accepted"
) -> ReportFile:
    """A response file holding ``items`` with their status codes, and the items marked as its
    ``state`` leaves them: accepted (DROP holds them, as when DROP takes a file), or another
    (written, refused, rejected: the items wait with it and DROP holds what it held)."""
    taken = set(ReportFile.objects.filter(cycle=cycle).values_list("file_name", flat=True))
    name = response_name(items[0].file_name, kind=kind, taken=taken)
    built = build_response_file(name, [(i.work_item_id, i.status_code or 5) for i in items])
    taken_by_drop = state in ("accepted", "manual")
    report_file = ReportFileFactory.create(
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
        taken_at = timezone.now()
        rows.update(
            state=WorkItemState.REPORTED,
            reported_status_code=F("status_code"),
            reported_at=taken_at,
            first_reported_at=Coalesce("first_reported_at", Value(taken_at)),
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


def drop_noon(days: int = 0) -> dt.datetime:
    """Noon of the DROP day ``days`` from today: a round or a due date falls on a DROP day,
    and a moment near midnight would land on another one once a daylight-saving change lies
    between it and a date weeks away."""
    day = drop_today() + dt.timedelta(days=days)
    return dt.datetime.combine(day, dt.time(12), tzinfo=drop_timezone())


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
    integration = WebhookIntegrationFactory.create(broker=broker)
    cycle = DropCycleFactory.create(broker=broker)

    def request(item: WorkItem, remote_identifier: str = "C-1", **fields: Any) -> DeletionRequest:
        return DeletionRequestFactory.create(
            work_item=item,
            consumer=ConsumerFactory.create(
                broker=item.broker, remote_identifier=remote_identifier
            ),
            remote_identifier=remote_identifier,
            remote_identifier_kind="",
            identifier_hash="A" * 43 + "=",
            **fields,
        )

    first = WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="A1b2C3d4E5f6")
    deleted = request(
        first,
        drop_outcome="deleted",
        integration=integration,
        matched_at=at("2026-03-12T10:00:00"),
        dispatched_at=at("2026-03-12T10:05:00"),
        completed_at=at("2026-03-13T08:00:00"),
        attempts=2,
    )
    for number, (started, status) in enumerate(
        [("2026-03-12T10:00:05", 500), ("2026-03-12T10:05:00", 200)], start=1
    ):
        DeliveryAttemptFactory.create(
            deletion_request=deleted, number=number, started_at=at(started), status=status
        )
    items_reported(cycle, [first])
    second = WorkItemFactory.create(cycle=cycle, list_type="Phone")
    failed = request(
        second,
        "@crm:user-7",
        drop_outcome="failed",
        integration=integration,
        error_message='=HYPERLINK("http://evil.example")',
        matched_at=at("2026-03-13T10:00:00"),
    )
    third = WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="Late0Match01")
    amended = request(
        third,
        "C-late",
        drop_outcome="deleted",
        integration=integration,
        late_match=True,
        matched_at=at("2026-04-02T10:00:00"),
    )
    items_reported(cycle, [third], kind="amend")
    other_item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=other))
    other_request = request(
        other_item, drop_outcome="not_found", matched_at=at("2026-03-12T10:00:00")
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
    # One INSERT for them all, not one per item: many admin tests start from this sample.
    return WorkItem.objects.bulk_create(
        WorkItemFactory.build(cycle=cycle, state=state, status_code=status_code)
        for (state, status_code), n in spec.items()
        for _ in range(n)
    )


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
    report_file = ReportFileFactory.create(
        cycle=previous,
        rows=16,
        state=ReportFileState.ACCEPTED,
        uploaded_at=previous.downloaded_at + dt.timedelta(days=3),
    )
    # Written for the open cycle but not uploaded yet (manual upload mode).
    ReportFileFactory.create(cycle=cycle, rows=10, sha256="1" * 64)
    integration = WebhookIntegrationFactory.create(broker=broker, name="Acme deletions")
    consumer = ConsumerFactory.create(broker=broker, remote_identifier="C-1")
    ConsumerHashFactory.create(consumer=consumer, hash=hashlib.sha256(b"C-1").digest())
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
        DeliveryAttemptFactory.create(
            deletion_request=world.requests[request],
            number=number,
            started_at=now - dt.timedelta(days=days_ago),
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
    OptOutRecordFactory.create(deletion_request=world.requests["completed"])
    # A row of the reported cycle DROP sent malformed (answered in DROP's portal since).
    UnreadableWorkItemFactory.create(
        cycle=previous,
        file_name=report_file.file_name,
        line=18,
        work_item_id="680",
        text="680,5",
        reason="hash must be 44 characters of standard Base64 ending in '=', found '5'",
    )
    # The consumer of the completed request, brought back by a supplier's file.
    ReappearanceFactory.create(work_item=world.requests["completed"].work_item, consumer=consumer)
    return world


def work_item_of(request: DeletionRequest) -> WorkItem:
    """A DROP request's work item (a canary round's request has none)."""
    assert request.work_item is not None, f"{request} is a canary round's request"
    return request.work_item
