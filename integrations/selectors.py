"""Read paths shared by the API, the admin, the commands and the exports."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    Max,
    Min,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
    Window,
)
from django.db.models.functions import Cast, Coalesce, NullIf, RowNumber
from django.utils import timezone

from integrations import exports
from integrations.dispatch.policy import AUTO_REDISPATCH_ACTOR, AUTO_REDISPATCH_MAX
from integrations.models import (
    Broker,
    CycleState,
    DeletionRequest,
    DeliveryAttempt,
    DropCycle,
    Integration,
    LedgerEvent,
    ReportFile,
    ReportKind,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)

LEDGER_COLUMNS = (
    "id",
    "created_at",
    "broker_id",
    "kind",
    "subject",
    "actor",
    "data",
    "event_hash",
    "chain_hash",
)

M = TypeVar("M", bound=Model)


def model_from_row(model: type[M], columns: dict[str, Any]) -> M:
    """An instance of ``model`` loaded from hand-written SQL, by ``Model.from_db``:
    ``columns`` by attname, as stored (no converters run). Fields left out are deferred:
    they load from the database when first read."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in columns]
    return model.from_db(connection.alias, names, [columns[name] for name in names])


def ledger_events(
    *,
    broker_id: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    events: QuerySet[LedgerEvent] | None = None,
    chunk_size: int = 5000,
) -> Iterator[dict[str, Any]]:
    """Ledger events in order, as export rows (``chain_hash`` empty until sealed).

    ``events`` narrows them further (the admin's filtered list); default: all of them.
    """
    base = LedgerEvent.objects.all() if events is None else events
    events = base.order_by("id").select_related("chain_link")
    if broker_id:
        events = events.filter(broker_id=broker_id)
    if since:
        events = events.filter(created_at__gte=since)
    if until:
        events = events.filter(created_at__lt=until)
    for event in events.iterator(chunk_size=chunk_size):
        link = getattr(event, "chain_link", None)
        yield {
            "id": event.id,
            "created_at": event.created_at,
            "broker_id": event.broker_id,
            "kind": event.kind,
            "subject": event.subject,
            "actor": event.actor,
            "data": event.data,
            "event_hash": event.event_hash,
            "chain_hash": link.chain_hash if link else "",
        }


# --- The staff dashboard (admin index) ---------------------------------------------------
# A handful of aggregate queries for every broker at once; nothing here loops over rows.

AWAITING_CALLBACK_ATTENTION = dt.timedelta(days=7)
# Integration health looks at this many of the latest delivery attempts (by id, which grows
# with time): the attempts table keeps every attempt for good, the dashboard must not.
HEALTH_ATTEMPTS = 100_000
DASHBOARD_RECENT_CYCLES = 8


@dataclass(frozen=True)
class CycleWorkItems:
    """A cycle, how many of its work items are in each (state, status_code) (open cycles
    only), and how many of its deletion requests ended with each broker outcome ("" while
    none came back)."""

    cycle: DropCycle
    counts: dict[tuple[str, int | None], int]
    request_outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_status(self) -> dict[int | None, int]:
        """Work items owed a status (removed ones are not), by status code (None: unknown)."""
        totals: dict[int | None, int] = {}
        for (state, status_code), n in self.counts.items():
            if state != WorkItemState.REMOVED:
                totals[status_code] = totals.get(status_code, 0) + n
        return totals

    @property
    def owed(self) -> int:
        return sum(self.by_status().values())

    @property
    def with_status(self) -> int:
        return sum(n for code, n in self.by_status().items() if code is not None)

    @property
    def reported(self) -> int:
        return sum(n for (state, _), n in self.counts.items() if state == WorkItemState.REPORTED)


@dataclass(frozen=True)
class RequestsNeedingAttention:
    failed: int = 0
    undeliverable: int = 0
    awaiting_callback: int = 0  # dispatched more than AWAITING_CALLBACK_ATTENTION ago

    @property
    def total(self) -> int:
        return self.failed + self.undeliverable + self.awaiting_callback


@dataclass(frozen=True)
class IntegrationHealth:
    integration: Integration
    last_success_at: dt.datetime | None  # the last delivery attempt answered with a 2xx
    failures_in_a_row: int  # attempts since then that were not
    # False when no success was found among the recent attempts looked at, and older ones
    # exist: the success is older (or never was) and the failures are at least that many.
    complete: bool = True


@dataclass(frozen=True)
class BrokerOverview:
    broker: Broker
    current_cycle: CycleWorkItems | None  # the latest open cycle
    open_cycles: list[CycleWorkItems]  # newest first
    recent_cycles: list[CycleWorkItems]  # oldest first, at most DASHBOARD_RECENT_CYCLES
    attention: RequestsNeedingAttention
    integrations: list[IntegrationHealth]
    last_download_at: dt.datetime | None
    last_upload_at: dt.datetime | None
    # The last pull from DROP, when it failed and nothing was pulled or imported since
    # (a 401/403 from DROP lands here: staff must act).
    failed_pull: LedgerEvent | None = None
    # The periodic stuck check's last result that changed (``services.doctor``), if any.
    doctor: LedgerEvent | None = None


# The events that say how the broker's last download went.
_PULL_OUTCOME_KINDS = ("drop.pulled", "drop.cycle_imported", "drop.pull_failed")


def dashboard_overview(*, now: dt.datetime) -> list[BrokerOverview]:
    """Everything the dashboard shows, per broker, in eleven queries whatever the data size."""
    brokers = list(
        Broker.objects.annotate(
            last_download_at=Max("cycles__downloaded_at"),
            last_upload_at=Subquery(
                ReportFile.objects.filter(broker=OuterRef("pk"), uploaded_at__isnull=False)
                .order_by("-uploaded_at")
                .values("uploaded_at")[:1]
            ),
        ).order_by("broker_id")
    )
    recent = list(
        DropCycle.objects.annotate(
            recency=Window(
                RowNumber(), partition_by=F("broker_id"), order_by=F("downloaded_at").desc()
            )
        ).filter(recency__lte=DASHBOARD_RECENT_CYCLES)
    )
    recent_ids = {cycle.pk for cycle in recent}
    shown = recent + list(
        DropCycle.objects.filter(state=CycleState.OPEN).exclude(pk__in=recent_ids)
    )
    # Work items are counted for open cycles only: a closed cycle's are all reported, and a
    # DROP list is mostly unmatched items, so counting every recent cycle's would cost the
    # page most of its time.
    counts: dict[int, dict[tuple[str, int | None], int]] = {c.pk: {} for c in shown}
    for row in (
        WorkItem.objects.filter(cycle_id__in=[c.pk for c in shown if c.state == CycleState.OPEN])
        .values("cycle_id", "state", "status_code")
        .annotate(n=Count("id"))
        .order_by()
    ):
        counts[row["cycle_id"]][(row["state"], row["status_code"])] = row["n"]
    # A request carries its cycle's drop_session_id: no join back to the work items.
    cycle_of_session = {(c.broker_id, c.drop_session_id): c.pk for c in recent}
    outcomes: dict[int, dict[str, int]] = {pk: {} for pk in recent_ids}
    for broker_pk, session, drop_outcome, n in (
        DeletionRequest.objects.filter(drop_session_id__in={c.drop_session_id for c in recent})
        .exclude(state=RequestState.CANCELLED)
        .values("broker_id", "drop_session_id", "drop_outcome")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("broker_id", "drop_session_id", "drop_outcome", "n")
    ):
        cycle_pk = cycle_of_session.get((broker_pk, session))
        if cycle_pk is not None:
            outcomes[cycle_pk][drop_outcome] = n
    cycles_of: dict[int, list[CycleWorkItems]] = {}
    for cycle in shown:
        cycles_of.setdefault(cycle.broker_id, []).append(
            CycleWorkItems(cycle, counts[cycle.pk], outcomes.get(cycle.pk, {}))
        )

    attention = {
        row["broker_id"]: RequestsNeedingAttention(
            failed=row["failed"],
            undeliverable=row["undeliverable"],
            awaiting_callback=row["awaiting_callback"],
        )
        for row in deletion_requests_needing_attention(now=now)
        .values("broker_id")
        .annotate(
            failed=Count("id", filter=Q(state=RequestState.FAILED)),
            undeliverable=Count("id", filter=Q(state=RequestState.UNDELIVERABLE)),
            awaiting_callback=Count("id", filter=Q(state=RequestState.DISPATCHED)),
        )
        .order_by()
    }
    health, looked_at_all = integration_delivery_health()
    health_of: dict[int, list[IntegrationHealth]] = {}
    for integration in Integration.objects.order_by("broker_id", "name"):
        last_success_at, failures = health.get(integration.pk, (None, 0))
        health_of.setdefault(integration.broker_id, []).append(
            IntegrationHealth(
                integration=integration,
                last_success_at=last_success_at,
                failures_in_a_row=failures,
                complete=looked_at_all or last_success_at is not None,
            )
        )

    last_pull_event = {
        event.broker_id: event
        for event in LedgerEvent.objects.filter(kind__in=_PULL_OUTCOME_KINDS)
        .order_by("broker_id", "-id")
        .distinct("broker_id")
    }

    last_doctor_event = {
        event.broker_id: event
        for event in LedgerEvent.objects.filter(kind="drop.doctor_checked")
        .order_by("broker_id", "-id")
        .distinct("broker_id")
    }

    overviews = []
    for broker in brokers:
        pull_event = last_pull_event.get(broker.broker_id)
        cycles = sorted(
            cycles_of.get(broker.pk, []), key=lambda c: c.cycle.downloaded_at, reverse=True
        )
        opened = [c for c in cycles if c.cycle.state == CycleState.OPEN]
        overviews.append(
            BrokerOverview(
                broker=broker,
                current_cycle=opened[0] if opened else None,
                open_cycles=opened,
                recent_cycles=[c for c in reversed(cycles) if c.cycle.pk in recent_ids],
                attention=attention.get(broker.pk, RequestsNeedingAttention()),
                integrations=health_of.get(broker.pk, []),
                last_download_at=broker.last_download_at,  # type: ignore[attr-defined]
                last_upload_at=broker.last_upload_at,  # type: ignore[attr-defined]
                failed_pull=pull_event
                if pull_event and pull_event.kind == "drop.pull_failed"
                else None,
                doctor=last_doctor_event.get(broker.broker_id),
            )
        )
    return overviews


def deletion_requests_needing_attention(*, now: dt.datetime) -> QuerySet[DeletionRequest]:
    """Failed or undeliverable requests, and those awaiting a callback for over a week."""
    return DeletionRequest.objects.filter(
        Q(state__in=[RequestState.FAILED, RequestState.UNDELIVERABLE])
        | Q(state=RequestState.DISPATCHED, dispatched_at__lt=now - AWAITING_CALLBACK_ATTENTION)
    )


def _succeeded() -> Q:
    return Q(status__gte=200, status__lt=300)


def _failed() -> Q:
    return Q(status__isnull=True) | Q(status__lt=200) | Q(status__gte=300)


def _count(queryset: QuerySet[Any]) -> Subquery:
    """The number of rows of ``queryset`` as a subquery (correlate it with ``OuterRef``)."""
    return Subquery(
        queryset.order_by().annotate(one=Value(1)).values("one").annotate(n=Count("*")).values("n")
    )


def integration_delivery_health(
    *, attempts_looked_at: int = HEALTH_ATTEMPTS
) -> tuple[dict[int, tuple[dt.datetime | None, int]], bool]:
    """Per integration id: the last delivery attempt answered with a 2xx, and how many
    attempts failed since (all of them when none succeeded); and whether every attempt ever
    made was looked at (else only the latest ``attempts_looked_at``).

    An integration is called for deletion and for resolution requests; both count. Two
    index-bounded passes, whatever the number of integrations or of attempts kept.
    """
    newest = DeliveryAttempt.objects.aggregate(newest=Max("id"))["newest"] or 0
    complete = not DeliveryAttempt.objects.filter(id__lte=newest - attempts_looked_at).exists()
    attempts = (
        DeliveryAttempt.objects.filter(id__gt=newest - attempts_looked_at)
        .annotate(
            integration_id=Coalesce(
                "deletion_request__integration_id", "resolution_request__integration_id"
            )
        )
        .filter(integration_id__isnull=False)
    )
    last_success: dict[int, dt.datetime] = dict(
        attempts.filter(_succeeded())
        .values("integration_id")
        .annotate(last=Max("started_at"))
        .order_by()
        .values_list("integration_id", "last")
    )
    since_then = Q(integration_id__isnull=False)
    if last_success:
        # Failures after each integration's own last success (a handful of integrations).
        since_then = ~Q(integration_id__in=list(last_success))
        for integration_id, at in last_success.items():
            since_then |= Q(integration_id=integration_id, started_at__gt=at)
    failures = dict(
        attempts.filter(_failed())
        .filter(since_then)
        .values("integration_id")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("integration_id", "n")
    )
    health = {
        integration_id: (last_success.get(integration_id), failures.get(integration_id, 0))
        for integration_id in {*last_success, *failures}
    }
    return health, complete


# --- Outcome history (auditors) and deadlines (issue 7) ----------------------------------

OUTCOME_COLUMNS = (
    "request_uuid",
    "broker_id",
    "drop_session_id",
    "match_date",
    "work_item_id",
    "list_type",
    "hash_type",
    "identifier_hash",
    "remote_identifier",
    "remote_identifier_kind",
    "integration_id",
    "isi_connection_id",
    "state",
    "drop_outcome",
    "drop_status_code",
    "error_message",
    "attempts",
    "matched_at",
    "dispatched_at",
    "acknowledged_at",
    "completed_at",
    "work_item_status_code",
    "reported_status_code",
    "reported_at",
    "report_file",
    "amended",
    "late_match",
)

# ISO 8601 in UTC, e.g. 2026-03-12T09:00:00.25+00:00. PostgreSQL's own text form of a
# timestamp with a "T" is about twice as fast as to_char(), and a million rows carry five.
_UTC_ISO = "replace((%(expressions)s AT TIME ZONE 'UTC')::text, ' ', 'T') || '+00:00'"


def _utc_text(expression: Any) -> Func:
    """A timestamp as ISO 8601 text, made by PostgreSQL: the export's hot loop then handles
    strings only (Django parses a timestamp in Python, seconds per million)."""
    return Func(expression, template=_UTC_ISO, output_field=CharField())


def _text(field: str) -> Cast:
    return Cast(field, output_field=CharField())


def _outcome_values() -> tuple[dict[str, Any], list[str]]:
    """Annotations and the ``values_list`` names producing ``OUTCOME_COLUMNS`` in order."""
    first_sent = (
        DeliveryAttempt.objects.filter(deletion_request=OuterRef("pk"))
        .order_by("started_at")
        .values("started_at")[:1]
    )
    list_types = [When(hash_type=hash_type, then=Value(name)) for hash_type, name in _LIST_TYPES]
    computed: dict[str, Any] = {
        "request_uuid": _text("request_uuid"),
        "match_date": _text("match_date"),
        "list_type": Case(*list_types, default=F("hash_type"), output_field=CharField()),
        "integration_id": _text("integration__uuid"),
        "isi_connection_id": _text("isi_connection__uuid"),
        "drop_outcome": NullIf("drop_outcome", Value(""), output_field=CharField()),
        "error_message": NullIf("error_message", Value(""), output_field=CharField()),
        "matched_at": _utc_text(F("matched_at")),
        # A request acknowledged at its first attempt was sent when it was acknowledged
        # (within the 15 s timeout); only the others look up their first attempt, so the
        # export does not pay an index probe per row.
        "dispatched_at": _utc_text(
            Case(
                When(attempts__lte=1, dispatched_at__isnull=False, then=F("dispatched_at")),
                default=Coalesce(Subquery(first_sent), F("dispatched_at")),
            )
        ),
        "acknowledged_at": _utc_text(F("dispatched_at")),
        "completed_at": _utc_text(F("completed_at")),
        "reported_at": _utc_text(F("work_item__reported_at")),
        "amended": Coalesce(
            ExpressionWrapper(
                Q(work_item__report_file__kind=ReportKind.AMEND), output_field=BooleanField()
            ),
            Value(False),
        ),
    }
    fields = {
        "broker_id": "broker_id_code",
        "work_item_id": "work_item__work_item_id",
        "work_item_status_code": "work_item__status_code",
        "reported_status_code": "work_item__reported_status_code",
        "report_file": "work_item__report_file__file_name",
    }
    # Annotation names may not shadow model fields, hence the prefix.
    annotations = {f"out_{column}": expression for column, expression in computed.items()}
    names = [
        f"out_{column}" if column in computed else fields.get(column, column)
        for column in OUTCOME_COLUMNS
    ]
    return annotations, names


def _outcome_rows(
    *,
    broker_id: str | None,
    since: dt.datetime | None,
    until: dt.datetime | None,
    requests: QuerySet[DeletionRequest] | None,
) -> QuerySet[DeletionRequest, tuple[Any, ...]]:
    """``(id, *OUTCOME_COLUMNS)`` tuples of the filtered requests, not yet ordered."""
    rows = requests if requests is not None else DeletionRequest.objects.all()
    if broker_id:
        rows = rows.filter(broker_id_code=broker_id)
    if since:
        rows = rows.filter(matched_at__gte=since)
    if until:
        rows = rows.filter(matched_at__lt=until)
    annotations, names = _outcome_values()
    return rows.annotate(**annotations).values_list("pk", *names).order_by()


def deletion_outcomes(
    *,
    broker_id: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    requests: QuerySet[DeletionRequest] | None = None,
    after_id: int | None = None,
    limit: int | None = None,
    chunk_size: int = 5000,
) -> Iterator[dict[str, Any]]:
    """One row per deletion request with its whole history (``OUTCOME_COLUMNS``), by id.

    Filters: ``broker_id`` (4 digits), ``since``/``until`` on the match time (until
    exclusive), ``requests`` (e.g. an admin changelist's filtered queryset); ``after_id``
    and ``limit`` page by the request id, which each row carries as ``id``.

    ``dispatched_at`` is the first delivery attempt (when the request was sent),
    ``acknowledged_at`` the broker's 2xx; ``report_file``/``reported_at`` say which file
    took the work item's status to DROP and when, ``amended`` that it was an amendment.
    Times are ISO 8601 text in UTC; empty text fields are None.
    """
    values = _outcome_rows(broker_id=broker_id, since=since, until=until, requests=requests)
    if after_id is not None:
        values = values.filter(pk__gt=after_id)
    values = values.order_by("pk")
    columns = ("id", *OUTCOME_COLUMNS)
    if limit is not None:
        for row in values[:limit]:
            yield dict(zip(columns, row, strict=True))
        return
    # Inside a transaction the server-side cursor streams; outside one (autocommit) it is
    # WITH HOLD and PostgreSQL materializes the whole result before the first row. The
    # transaction also gives the export one consistent snapshot.
    with transaction.atomic():
        for row in values.iterator(chunk_size=chunk_size):
            yield dict(zip(columns, row, strict=True))


# CSV columns of free text the broker's systems fill in, defused against formulas. Never a
# hash, id or code: those must match DROP's files and the broker's records byte for byte (a
# Base64 hash may start with "+", a pointer with "@"); the JSONL export is exact throughout.
_OUTCOME_FREE_TEXT = frozenset({"error_message"})
_OUTCOME_BOOLEANS = frozenset({"amended", "late_match"})
_CSV_CHUNK = 1 << 16


def _outcome_csv_column(column: str) -> str:
    quoted = f'o."{column}"'
    if column in _OUTCOME_FREE_TEXT:
        return exports.csv_cell_sql(quoted)
    if column in _OUTCOME_BOOLEANS:
        return f"CASE WHEN {quoted} THEN 'true' ELSE 'false' END"
    return quoted


def deletion_outcomes_csv(
    *,
    broker_id: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    requests: QuerySet[DeletionRequest] | None = None,
) -> Iterator[bytes]:
    """The rows of ``deletion_outcomes`` as UTF-8 CSV (header first, LF line ends), in
    chunks of about 64 KiB.

    PostgreSQL writes the CSV (``COPY ... TO STDOUT``) and defuses formulas
    (``exports.csv_cell_sql``): a million rows stream in seconds at flat memory, where
    building them in Python would take most of a minute.
    """
    values = _outcome_rows(broker_id=broker_id, since=since, until=until, requests=requests)
    sql, params = values.query.sql_with_params()
    aliases = ", ".join(f'"{column}"' for column in ("id", *OUTCOME_COLUMNS))
    select = ", ".join(_outcome_csv_column(column) for column in OUTCOME_COLUMNS)
    copy_sql = (
        f"COPY (SELECT {select} FROM ({sql}) AS o({aliases}) ORDER BY o.id)"  # noqa: S608
        " TO STDOUT WITH (FORMAT csv)"
    )
    yield (",".join(OUTCOME_COLUMNS) + "\n").encode()
    with transaction.atomic(), connection.cursor() as cursor:
        # For this one big read only: JIT compiling the plan costs seconds and saves
        # nothing here, and the hash join and sort spill to disk in the default 4 MB.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        with cursor.copy(copy_sql, params) as copy:
            chunk = bytearray()
            for block in copy:
                chunk += block
                if len(chunk) >= _CSV_CHUNK:
                    yield bytes(chunk)
                    chunk.clear()
            if chunk:
                yield bytes(chunk)


_LIST_TYPES = (
    ("email", "Email"),
    ("phone", "Phone"),
    ("ndz", "NDZ"),
    ("name_vin", "NameVIN"),
    ("maid", "MAID"),
    ("ctvid", "CTVID"),
)


@dataclass(frozen=True)
class CycleDeadline:
    """Where a cycle stands against its due date (``settings.DROPPORTAL_REPORT_DAYS``)."""

    cycle: DropCycle
    days_left: int  # negative when overdue
    owed: int  # work items DROP is owed a status for and has not got yet
    not_reportable: int  # of which still wait for an outcome (or for staff)

    @property
    def overdue(self) -> bool:
        return self.owed > 0 and self.days_left < 0


def _owed_items(prefix: str = "") -> Q:
    """Work items DROP has no status for yet: not removed, never reported."""
    return Q(
        **{
            f"{prefix}state__in": [WorkItemState.OPEN, WorkItemState.REPORTABLE],
            f"{prefix}reported_at__isnull": True,
        }
    )


def drop_cycles_by_urgency(cycles: QuerySet[DropCycle] | None = None) -> QuerySet[DropCycle]:
    """Cycles annotated with ``owed_items`` (no status sent to DROP yet) and
    ``unreportable_items`` (of which still waiting for an outcome), most urgent first:
    cycles owing statuses by due date, then the rest, newest first.

    For the cycles admin (``get_queryset``) and ``cycle_deadlines``.
    """
    cycles = cycles if cycles is not None else DropCycle.objects.all()
    owed = WorkItem.objects.filter(_owed_items(), cycle=OuterRef("pk"))
    return cycles.annotate(
        owed_items=Coalesce(_count(owed), 0),
        unreportable_items=Coalesce(_count(owed.filter(state=WorkItemState.OPEN)), 0),
    ).order_by(
        Case(When(owed_items__gt=0, then=Value(0)), default=Value(1)),
        "due_date",
        "-downloaded_at",
    )


def cycle_deadlines(*, broker_id: str | None = None, today: dt.date) -> list[CycleDeadline]:
    """Every cycle still owing statuses to DROP, most urgent first."""
    cycles = DropCycle.objects.filter(state=CycleState.OPEN).select_related("broker")
    if broker_id:
        cycles = cycles.filter(broker__broker_id=broker_id)
    return [
        CycleDeadline(
            cycle=cycle,
            days_left=(cycle.due_date - today).days,
            owed=cycle.owed_items,  # type: ignore[attr-defined]
            not_reportable=cycle.unreportable_items,  # type: ignore[attr-defined]
        )
        for cycle in drop_cycles_by_urgency(cycles)
        if cycle.owed_items  # type: ignore[attr-defined]
    ]


# DROP answers a refused key (or account) with these; retrying cannot help until staff change
# the key or the URL it is sent to.
DROP_KEY_REFUSED_STATUSES = (401, 403)
# What changes the key DROP sees: the key itself, the base URL, or the mode (its default URL).
_DROP_ACCESS_FIELDS = ["drop_api_key", "drop_base_url", "mode"]


def _last_event_id(**filters: Any) -> Subquery:
    events = LedgerEvent.objects.filter(broker_id=OuterRef("broker_id"), **filters)
    return Subquery(events.order_by("-id").values("id")[:1])


def brokers_with_drop_key_refused(
    brokers: QuerySet[Broker] | None = None,
) -> QuerySet[Broker]:
    """Brokers whose last word from DROP on a pull is a refused key (401 or 403), with no
    change of their DROP key, base URL or mode and no successful pull since; annotated with
    ``drop_key_refused_event`` (the ``drop.pull_failed`` ledger event's id)."""
    brokers = brokers if brokers is not None else Broker.objects.all()
    refused = _last_event_id(
        kind="drop.pull_failed", data__status__in=list(DROP_KEY_REFUSED_STATUSES)
    )
    pulled = _last_event_id(kind="drop.pulled")
    changed = _last_event_id(kind="broker.updated", data__changes__has_any_keys=_DROP_ACCESS_FIELDS)
    return (
        brokers.annotate(
            drop_key_refused_event=refused,
            drop_key_cleared_event=Coalesce(Func(pulled, changed, function="GREATEST"), Value(0)),
        )
        .filter(drop_key_refused_event__isnull=False)
        .filter(drop_key_refused_event__gt=F("drop_key_cleared_event"))
    )


def brokers_due_for_pull(*, now: dt.datetime) -> QuerySet[Broker]:
    """Brokers whose auto-pull is on and whose last pull is ``pull_interval_days`` old (or
    who never pulled), for the periodic pull job. A broker without a DROP API key is
    included: its pull fails into the ledger, where staff see it. A broker whose DROP key
    was refused (``brokers_with_drop_key_refused``) is not: asking again every hour with
    the same key cannot help, and the dashboard shows why."""
    interval = ExpressionWrapper(
        F("pull_interval_days") * dt.timedelta(days=1), output_field=DurationField()
    )
    refused = brokers_with_drop_key_refused().values("pk")
    return (
        Broker.objects.filter(auto_pull=True)
        .exclude(pk__in=refused)
        .annotate(pull_due_at=F("last_pulled_at") + interval)
        .filter(Q(last_pulled_at__isnull=True) | Q(pull_due_at__lte=now))
        .order_by("broker_id")
    )


def automatic_redispatches() -> Coalesce:
    """For deletion requests: how often the automatic policy redispatched each one, counted
    from its ``deletion_request.redispatched`` ledger events by ``AUTO_REDISPATCH_ACTOR``."""
    count = (
        LedgerEvent.objects.filter(
            kind="deletion_request.redispatched",
            actor=AUTO_REDISPATCH_ACTOR,
            subject=Cast(OuterRef("request_uuid"), CharField()),
        )
        .order_by()
        .values("subject")
        .annotate(n=Count("id"))
        .values("n")
    )
    return Coalesce(Subquery(count), 0)


# --- Stuck work items (``drop doctor``) ----------------------------------------------------


class StuckReason(enum.StrEnum):
    """Why a work item has no live path to a status: nothing automatic will move it."""

    PENDING_WITHOUT_TARGET = "pending_without_target"
    FAILED_WAITING_FOR_STAFF = "failed_waiting_for_staff"
    UNDELIVERABLE = "undeliverable"
    NO_CALLBACK = "no_callback"
    RESOLUTION_STUCK = "resolution_stuck"
    INTEGRATION_DISABLED = "integration_disabled"
    DROP_KEY_REFUSED = "drop_key_refused"

    @property
    def label(self) -> str:
        return STUCK_REASON_LABELS[self]


STUCK_REASON_LABELS: dict[StuckReason, str] = {
    StuckReason.PENDING_WITHOUT_TARGET: "pending without a target",
    StuckReason.FAILED_WAITING_FOR_STAFF: "failed, waiting for staff to redispatch",
    StuckReason.UNDELIVERABLE: "undeliverable",
    StuckReason.NO_CALLBACK: "dispatched, no callback for more than 7 days",
    StuckReason.RESOLUTION_STUCK: "identifier retrieval or SaaS deletion stuck",
    StuckReason.INTEGRATION_DISABLED: "waiting for a disabled integration",
    StuckReason.DROP_KEY_REFUSED: "DROP refused the broker's key",
}


@dataclass(frozen=True)
class StuckGroup:
    """The work items of one broker stuck for one reason."""

    broker_id: str  # the 4-digit DROP id
    reason: StuckReason
    work_items: int  # distinct open work items
    requests: int  # the requests (or SaaS deletions) holding them
    nearest_due_date: dt.date  # the earliest due date of their cycles
    admin_path: str  # the admin list of what holds them (a path, without the host)

    @property
    def label(self) -> str:
        return self.reason.label

    def as_json(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "reason": str(self.reason),
            "label": self.label,
            "work_items": self.work_items,
            "requests": self.requests,
            "nearest_due_date": self.nearest_due_date.isoformat(),
            "admin_path": self.admin_path,
        }


def _admin_path(model: str, **params: Any) -> str:
    from django.urls import reverse
    from django.utils.http import urlencode

    return f"{reverse(f'admin:integrations_{model}_changelist')}?{urlencode(params)}"


def _stuck_counts(
    rows: QuerySet[Any], *, item: str, broker: str, due: str
) -> list[tuple[str, int, int, int, dt.date]]:
    """(broker_id, broker pk, work items, rows, nearest due date) per broker of ``rows``."""
    return [
        (row["b"], row["bpk"], row["items"], row["n"], row["due"])
        for row in rows.values(b=F(f"{broker}__broker_id"), bpk=F(broker))
        .annotate(items=Count(item, distinct=True), n=Count("pk"), due=Min(due))
        .order_by("b")
    ]


def stuck_work_items(
    *, broker: Broker | None = None, now: dt.datetime | None = None
) -> list[StuckGroup]:
    """Every open work item (matched, status still owed) that has no live path to a status,
    grouped by broker and reason, nearest due date first.

    An item is stuck when one of its requests (or SaaS deletions) will not move without
    staff: its status needs them all. An item held for two reasons is in both groups.
    Removed items owe nothing and are never listed. Reads a few aggregate queries; no row
    is loaded.
    """
    now = now or timezone.now()
    stale = now - AWAITING_CALLBACK_ATTENTION
    open_item = {"work_item__state": WorkItemState.OPEN}
    deletions = DeletionRequest.objects.filter(**open_item)
    resolutions = ResolutionRequest.objects.filter(**open_item)
    saas = SaasDeletion.objects.filter(resolution__work_item__state=WorkItemState.OPEN)
    items = WorkItem.objects.filter(state__in=[WorkItemState.OPEN, WorkItemState.REPORTABLE])
    if broker is not None:
        deletions = deletions.filter(broker=broker)
        resolutions = resolutions.filter(broker=broker)
        saas = saas.filter(resolution__broker=broker)
        items = items.filter(broker=broker)
    failed = deletions.filter(state=RequestState.FAILED, integration__enabled=True)
    if settings.DROPPORTAL_AUTO_REDISPATCH_HOURS > 0:
        # The automatic policy sends a failure again, up to AUTO_REDISPATCH_MAX times.
        failed = failed.annotate(automatic=automatic_redispatches()).filter(
            automatic__gte=AUTO_REDISPATCH_MAX
        )
    waiting = [RequestState.QUEUED, RequestState.FAILED, RequestState.DISPATCHED]
    deletion_counts = {"item": "work_item", "broker": "broker"}
    deletion_due = "work_item__cycle__due_date"
    resolution_counts = {"item": "work_item", "broker": "broker"}
    saas_counts = {"item": "resolution__work_item", "broker": "resolution__broker"}
    saas_due = "resolution__work_item__cycle__due_date"
    sources: list[tuple[StuckReason, str, dict[str, Any], list[Any]]] = [
        (
            StuckReason.PENDING_WITHOUT_TARGET,
            "deletionrequest",
            {"state__exact": RequestState.PENDING},
            [(deletions.filter(state=RequestState.PENDING), deletion_counts, deletion_due)],
        ),
        (
            StuckReason.FAILED_WAITING_FOR_STAFF,
            "deletionrequest",
            {"state__exact": RequestState.FAILED},
            [(failed, deletion_counts, deletion_due)],
        ),
        (
            StuckReason.UNDELIVERABLE,
            "deletionrequest",
            {"state__exact": RequestState.UNDELIVERABLE},
            [
                (
                    deletions.filter(state=RequestState.UNDELIVERABLE),
                    deletion_counts,
                    deletion_due,
                ),
                (
                    resolutions.filter(state=RequestState.UNDELIVERABLE),
                    resolution_counts,
                    deletion_due,
                ),
                (saas.filter(state=RequestState.UNDELIVERABLE), saas_counts, saas_due),
            ],
        ),
        (
            StuckReason.NO_CALLBACK,
            "deletionrequest",
            {"state__exact": RequestState.DISPATCHED, "dispatched_at__lt": stale.isoformat()},
            [
                (
                    deletions.filter(state=RequestState.DISPATCHED, dispatched_at__lt=stale),
                    deletion_counts,
                    deletion_due,
                )
            ],
        ),
        (
            StuckReason.RESOLUTION_STUCK,
            "resolutionrequest",
            {},
            [
                (
                    resolutions.filter(
                        Q(state=RequestState.FAILED)
                        | Q(state=RequestState.DISPATCHED, dispatched_at__lt=stale)
                    ),
                    resolution_counts,
                    deletion_due,
                ),
                (
                    saas.filter(
                        Q(state=RequestState.FAILED)
                        | Q(state=RequestState.DISPATCHED, dispatched_at__lt=stale)
                        | Q(state=RequestState.QUEUED, saas_connection__enabled=False)
                    ),
                    saas_counts,
                    saas_due,
                ),
            ],
        ),
        (
            StuckReason.INTEGRATION_DISABLED,
            "integration",
            {"enabled__exact": 0},
            [
                (
                    deletions.filter(state__in=waiting, integration__enabled=False),
                    deletion_counts,
                    deletion_due,
                ),
                (
                    resolutions.filter(state__in=waiting, integration__enabled=False),
                    resolution_counts,
                    deletion_due,
                ),
            ],
        ),
    ]
    found: dict[tuple[str, StuckReason], StuckGroup] = {}

    def add(reason: StuckReason, model: str, params: dict[str, Any], counts: Any) -> None:
        for broker_id, broker_pk, n_items, n_rows, due in counts:
            key = (broker_id, reason)
            previous = found.get(key)
            broker_param = (
                {"broker_id__exact": broker_id}
                if model == "ledgerevent"
                else {"broker__id__exact": broker_pk}
            )
            found[key] = StuckGroup(
                broker_id=broker_id,
                reason=reason,
                # Over several kinds of rows an item may count twice: at most, never fewer.
                work_items=n_items + (previous.work_items if previous else 0),
                requests=n_rows + (previous.requests if previous else 0),
                nearest_due_date=min(due, previous.nearest_due_date) if previous else due,
                admin_path=previous.admin_path
                if previous
                else _admin_path(model, **broker_param, **params),
            )

    for reason, model, params, queries in sources:
        for rows, fields, due in queries:
            add(reason, model, params, _stuck_counts(rows, **fields, due=due))

    refused = brokers_with_drop_key_refused(
        Broker.objects.filter(pk=broker.pk) if broker is not None else None
    ).values_list("pk", flat=True)
    add(
        StuckReason.DROP_KEY_REFUSED,
        "ledgerevent",
        {"kind__exact": "drop.pull_failed"},
        _stuck_counts(
            items.filter(broker_id__in=list(refused)),
            item="pk",
            broker="broker",
            due="cycle__due_date",
        ),
    )
    order = list(StuckReason)
    return sorted(
        found.values(),
        key=lambda g: (g.broker_id, g.nearest_due_date, order.index(g.reason)),
    )


# --- The yearly DROP figures ---------------------------------------------------------------
# One pass over the year's work items in SQL (a year can hold tens of millions). A work item
# counts in the year its cycle was downloaded (UTC); its category is the status DROP holds
# (the last one reported to it). The figures' admin links filter with METRIC_FILTERS, and
# the tests hold the two to the same counts.

METRIC_FIGURES = (
    ("received", "Received (work items downloaded)"),
    ("matched", "Matched"),
    ("complied", "Complied with (3 deleted, 4 opted out)"),
    ("denied", "Denied (2 exempt)"),
    ("not_found", "Not found (5)"),
    ("open", "Still open (no status reported)"),
    ("removed", "Removed by DROP"),
)
_NOT_REMOVED = ~Q(state=WorkItemState.REMOVED)
METRIC_FILTERS: dict[str, Q] = {
    "received": Q(),
    "matched": Q(Exists(DeletionRequest.objects.filter(work_item=OuterRef("pk"))))
    | Q(Exists(ResolutionRequest.objects.filter(work_item=OuterRef("pk")))),
    "complied": _NOT_REMOVED & Q(reported_status_code__in=[3, 4]),
    "denied": _NOT_REMOVED & Q(reported_status_code=2),
    "not_found": _NOT_REMOVED & Q(reported_status_code=5),
    "open": _NOT_REMOVED & Q(reported_status_code__isnull=True),
    "removed": Q(state=WorkItemState.REMOVED),
}
NOT_GIVEN = "(not given)"

_YEAR_CYCLES = """
SELECT c.id, c.drop_session_id, c.downloaded_at FROM integrations_dropcycle c
WHERE c.broker_id = %(broker)s AND c.downloaded_at >= %(start)s AND c.downloaded_at < %(end)s
"""
# One pass over the work items, narrow rows (the sort by list type for the ROLLUP and the
# ordered-set aggregates is most of the cost).
_METRICS_SQL = (
    "WITH cycles AS ("  # noqa: S608  (constants only)
    + _YEAR_CYCLES
    + """)
SELECT w.hash_type, count(*),
       count(*) FILTER (WHERE w.state <> 'removed' AND w.reported_status_code IN (3, 4)),
       count(*) FILTER (WHERE w.state <> 'removed' AND w.reported_status_code = 2),
       count(*) FILTER (WHERE w.state <> 'removed' AND w.reported_status_code = 5),
       count(*) FILTER (WHERE w.state <> 'removed' AND w.reported_status_code IS NULL),
       count(*) FILTER (WHERE w.state = 'removed'),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY d.days),
       avg(d.days)
FROM cycles c
JOIN integrations_workitem w ON w.cycle_id = c.id
CROSS JOIN LATERAL (
    SELECT CASE WHEN w.reported_at IS NOT NULL AND w.reported_status_code IS NOT NULL
                AND w.state <> 'removed'
                THEN extract(epoch FROM w.reported_at) - extract(epoch FROM c.downloaded_at)
           END / 86400 AS days
) d
GROUP BY ROLLUP (w.hash_type)
"""
)
# Matched work items, from the requests (a tenth of the work items or less) rather than a
# join of every work item with them.
_MATCHED_SQL = (
    "WITH cycles AS ("  # noqa: S608  (constants only)
    + _YEAR_CYCLES
    + """), matched AS (
    SELECT d.work_item_id FROM integrations_deletionrequest d
    JOIN cycles c ON c.drop_session_id = d.drop_session_id
    WHERE d.broker_id = %(broker)s
    UNION
    SELECT r.work_item_id FROM integrations_resolutionrequest r
    JOIN cycles c ON c.drop_session_id = r.drop_session_id
    WHERE r.broker_id = %(broker)s
)
SELECT w.hash_type, count(*)
FROM matched m JOIN integrations_workitem w ON w.id = m.work_item_id
GROUP BY ROLLUP (w.hash_type)
"""
)
# Why a denial: the exemption basis of a resolution's "exempt" (a deletion callback's exempt
# carries none).
_EXEMPTION_BASES_SQL = """
SELECT coalesce((SELECT min(r.exemption_basis) FROM integrations_resolutionrequest r
                 WHERE r.work_item_id = w.id AND r.drop_outcome = 'exempt'
                   AND r.exemption_basis <> ''), %(not_given)s), count(*)
FROM integrations_dropcycle c JOIN integrations_workitem w ON w.cycle_id = c.id
WHERE c.broker_id = %(broker)s AND c.downloaded_at >= %(start)s AND c.downloaded_at < %(end)s
  AND w.state <> 'removed' AND w.reported_status_code = 2
GROUP BY 1 ORDER BY 2 DESC, 1
"""


@dataclass(frozen=True)
class MetricRow:
    list_type: str  # "Email", ..., or "Total"
    hash_type: str  # "" for the total
    figures: dict[str, int]
    median_days: float | None
    mean_days: float | None


@dataclass(frozen=True)
class DropMetrics:
    broker_id: str
    year: int
    rows: list[MetricRow]  # by list type, the total last
    exemption_bases: dict[str, int]

    @property
    def total(self) -> MetricRow:
        return self.rows[-1]

    def as_json(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "year": self.year,
            "by_list_type": [_metric_row_json(row) for row in self.rows[:-1]],
            "total": _metric_row_json(self.total),
            "exemption_bases": self.exemption_bases,
        }


def _metric_row_json(row: MetricRow) -> dict[str, Any]:
    return {
        "list_type": row.list_type,
        **row.figures,
        "median_days": row.median_days,
        "mean_days": row.mean_days,
    }


def drop_year_bounds(year: int) -> tuple[dt.datetime, dt.datetime]:
    return (
        dt.datetime(year, 1, 1, tzinfo=dt.UTC),
        dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC),
    )


def drop_metrics(*, broker: Broker, year: int) -> DropMetrics:
    """The year's DROP figures for ``broker``: counts by list type and in total, and the
    median and mean days from download to the status reported to DROP (rounded to 0.01)."""
    start, end = drop_year_bounds(year)
    params: dict[str, Any] = {
        "broker": broker.pk,
        "start": start,
        "end": end,
        "not_given": NOT_GIVEN,
    }
    names = dict(_LIST_TYPES)
    by_type: dict[str | None, MetricRow] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '256MB'")
        cursor.execute(_MATCHED_SQL, params)
        matched = dict(cursor.fetchall())
        cursor.execute(_METRICS_SQL, params)
        for hash_type, received, *counts, median, mean in cursor.fetchall():
            figures = [received, matched.get(hash_type, 0), *counts]
            by_type[hash_type] = MetricRow(
                list_type=names.get(hash_type, hash_type) if hash_type else "Total",
                hash_type=hash_type or "",
                figures=dict(zip([k for k, _ in METRIC_FIGURES], figures, strict=True)),
                median_days=None if median is None else round(float(median), 2),
                mean_days=None if mean is None else round(float(mean), 2),
            )
        cursor.execute(_EXEMPTION_BASES_SQL, params)
        bases = dict(cursor.fetchall())
    total = by_type.pop(None, None) or MetricRow(
        "Total", "", {k: 0 for k, _ in METRIC_FIGURES}, None, None
    )
    rows = [by_type[hash_type] for hash_type, _ in _LIST_TYPES if hash_type in by_type]
    return DropMetrics(broker.broker_id, year, [*rows, total], bases)
