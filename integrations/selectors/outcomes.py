"""Outcome history for auditors: one row per deletion request with its whole history, as
dicts or as CSV written by PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    ExpressionWrapper,
    F,
    Func,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, NullIf

from integrations import exports
from integrations.models import DeletionRequest, DeliveryAttempt, ReportKind
from integrations.selectors._common import LIST_TYPES

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
    # The first status DROP took for the item (an amendment moves reported_at, not this):
    # what the yearly days to respond count to, re-performed from the export.
    "first_reported_at",
    "report_file",
    "amended",
    "late_match",
    "round",  # 0: the match's own request; 1, 2...: a recurring deletion round's
)

# ISO 8601 in UTC, e.g. 2026-03-12T09:00:00.25+00:00. PostgreSQL's own text form of a
# timestamp with a "T" is cheaper than to_char() (docs/benchmarks.md, outcome history export).
_UTC_ISO = "replace((%(expressions)s AT TIME ZONE 'UTC')::text, ' ', 'T') || '+00:00'"


def _utc_text(expression: Any) -> Func:
    """A timestamp as ISO 8601 text, made by PostgreSQL: the export's hot loop then handles
    strings only (Django would parse every timestamp in Python, the export's main cost)."""
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
    list_types = [When(hash_type=hash_type, then=Value(name)) for hash_type, name in LIST_TYPES]
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
        # (within the 15 s timeout); only the others, and those sent again (whose count
        # started afresh), look up their first attempt, so the export does not pay an
        # index probe per row.
        "dispatched_at": _utc_text(
            Case(
                When(
                    attempts__lte=1,
                    requeued=False,
                    dispatched_at__isnull=False,
                    then=F("dispatched_at"),
                ),
                default=Coalesce(Subquery(first_sent), F("dispatched_at")),
            )
        ),
        "acknowledged_at": _utc_text(F("dispatched_at")),
        "completed_at": _utc_text(F("completed_at")),
        "reported_at": _utc_text(F("work_item__reported_at")),
        "first_reported_at": _utc_text(F("work_item__first_reported_at")),
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
    # DROP's requests only: a canary round's test requests are the evidence pack's own
    # records (selectors.canaries), never a DROP outcome.
    rows = rows.filter(canary_round__isnull=True)
    if broker_id:
        # A range of one value, not an equality, so that ordering by broker then id stays an
        # order PostgreSQL must serve (deletion_outcomes): it drops a column compared with =
        # from the order.
        rows = rows.filter(broker_id_code__gte=broker_id, broker_id_code__lte=broker_id)
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
    # One broker's rows by broker, then id (the same order, the broker being one), which only
    # the index on both (migration 0065) gives without a sort. By id alone PostgreSQL walked
    # the primary key, reckoning the broker's rows spread evenly among the others', and read
    # past every other broker's rows up to the page's: a broker's rows come in cycles.
    values = values.order_by("broker_id_code", "pk") if broker_id else values.order_by("pk")
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


# CSV columns of free text the broker's systems fill in, defused against formulas: the error
# and the broker's own pointer to the consumer (any text it chose, "=cmd|..." included).
# Never a hash, id or code we or DROP made: those must match DROP's files byte for byte (a
# Base64 hash may start with "+"); the JSONL export is exact throughout.
_OUTCOME_FREE_TEXT = frozenset({"error_message", "remote_identifier", "remote_identifier_kind"})
_OUTCOME_BOOLEANS = frozenset({"amended", "late_match"})


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
        # For this one big read only: JIT compiling the plan costs more than it saves here
        # (docs/benchmarks.md), and the hash join and sort spill to disk in the default 4 MB.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        # A web request's statements are bounded (DROPPORTAL_WEB_STATEMENT_TIMEOUT_MS); this
        # one streams the whole history after the 200 went out, and cut it would leave the
        # auditor a truncated file that looks whole.
        cursor.execute("SET LOCAL statement_timeout = 0")
        with cursor.copy(copy_sql, params) as copy:
            yield from exports.rechunk(copy)
