"""The broker's suppression list, and the reappearances of consumers on it.

Every hash DROP sent and did not remove is suppressed: the broker's work items in any state
but ``removed``. Nothing is copied into a list of its own; the work items are the list::

    found = suppressed_digests(broker=broker, digests=[("email", digest), ...])
    for chunk in suppressed_hashes_csv(broker=broker): out.write(chunk)   # hash_type,hash
    rows = reappearances_by_source_month(broker=broker, since=since)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from django.db import connection, transaction
from django.db.models import Count, Min
from django.db.models.functions import TruncMonth

from integrations import exports
from integrations.drop.calendar import drop_timezone
from integrations.models import Broker, Reappearance, WorkItemState

SUPPRESSION_COLUMNS: Final = ("hash_type", "hash")

# Each asked (hash_type, hash) pair that some work item of the broker not removed holds.
# The hash index finds each pair's work items (an equality probe a pair); the broker and
# state are checked on the rows found.
_SUPPRESSED_AMONG: Final = """
SELECT DISTINCT q.hash_type, q.hash
  FROM unnest(%(types)s::text[], %(hashes)s::bytea[]) AS q(hash_type, hash)
 WHERE EXISTS (SELECT 1 FROM integrations_workitem w
                WHERE w.hash = q.hash AND w.hash_type = q.hash_type
                  AND w.broker_id = %(broker)s AND w.state <> %(removed)s)
"""

# Every suppressed hash once, in a stable order, as DROP spells it (standard Base64). A
# hash is not a formula trigger to defuse: Base64 has no comma or quote, and a leading
# "+" or "=" must reach the warehouse as it is. Sorted by the hash first: its leading bytes
# tell rows apart at once, where sorting by the list type first (the same on most rows)
# compares every pair in full, three times slower (docs/benchmarks.md).
_SUPPRESSED_COPY: Final = """
COPY (SELECT DISTINCT ON (hash, hash_type) hash_type, encode(hash, 'base64')
        FROM integrations_workitem
       WHERE broker_id = {broker} AND state <> {removed}
       ORDER BY hash, hash_type)
  TO STDOUT WITH (FORMAT csv)
"""


def suppressed_digests(
    *, broker: Broker, digests: Iterable[tuple[str, bytes]]
) -> set[tuple[str, bytes]]:
    """The pairs of ``digests`` (list type, 32-byte SHA-256) that are suppressed for
    ``broker``."""
    pairs = sorted(set(digests))
    if not pairs:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            _SUPPRESSED_AMONG,
            {
                "types": [hash_type for hash_type, _ in pairs],
                "hashes": [digest for _, digest in pairs],
                "broker": broker.pk,
                "removed": WorkItemState.REMOVED.value,
            },
        )
        return {(hash_type, bytes(digest)) for hash_type, digest in cursor.fetchall()}


def suppressed_hashes_csv(*, broker: Broker, header: bool = True) -> Iterator[bytes]:
    """Every suppressed hash of ``broker`` as UTF-8 CSV ``hash_type,hash`` (header first
    unless ``header`` is false, LF line ends), each once, in the order of the raw hash, in
    chunks of about 64 KiB.

    PostgreSQL writes the CSV (``COPY ... TO STDOUT``) and the rows stream as they come:
    memory stays flat whatever the list's size (docs/benchmarks.md, suppression export).
    """
    if header:
        yield (",".join(SUPPRESSION_COLUMNS) + "\n").encode()
    copy_sql = _SUPPRESSED_COPY.format(
        broker=int(broker.pk), removed=f"'{WorkItemState.REMOVED.value}'"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # For this one big read only: the DISTINCT's sort spills to disk in the default 4 MB.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        with cursor.copy(copy_sql) as copy:
            yield from exports.rechunk(copy)


@dataclass(frozen=True)
class ReappearanceSummary:
    """Reappearances of one source in one month (of DROP's calendar)."""

    broker_id: str
    month: str  # YYYY-MM
    source: str  # the file, or "api key <prefix>"
    source_sha256: str  # the file's SHA-256 when the source is one file
    reappearances: int
    work_items: int
    first_at: dt.datetime


def reappearances_by_source_month(
    *, broker: Broker | None, since: dt.datetime | None = None
) -> list[ReappearanceSummary]:
    """The reappearances of ``broker`` (None: every broker's) counted by month of DROP's
    calendar and source, newest month first, the source with most reappearances first
    within a month."""
    rows = Reappearance.objects.all()
    if broker is not None:
        rows = rows.filter(broker=broker)
    if since is not None:
        rows = rows.filter(reappeared_at__gte=since)
    grouped = (
        rows.annotate(month=TruncMonth("reappeared_at", tzinfo=drop_timezone()))
        .values("broker__broker_id", "month", "source", "source_sha256", "api_key_prefix")
        .annotate(
            reappearances=Count("id"),
            work_items=Count("work_item", distinct=True),
            first_at=Min("reappeared_at"),
        )
        .order_by("-month", "-reappearances", "broker__broker_id", "source", "api_key_prefix")
    )
    return [
        ReappearanceSummary(
            broker_id=row["broker__broker_id"],
            month=f"{row['month']:%Y-%m}",
            source=Reappearance.label_of(row["source"], row["api_key_prefix"]),
            source_sha256=row["source_sha256"],
            reappearances=row["reappearances"],
            work_items=row["work_items"],
            first_at=row["first_at"],
        )
        for row in grouped
    ]
