"""DROP's side of the cycle: downloads (cycles) and their work items.

A ``DropCycle`` is one download: ``drop_session_id`` is the broker's download sequence
number as a numeric string. Every work item DROP sent is kept for good (the ongoing duty to
match consumers registered later), with its hash as 32 raw bytes like consumer hashes.
"""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.indexes import HashIndex
from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import models
from django.db.models import F, Func, Q, TextField, Value
from django.db.models.functions import Concat, Now

from integrations.drop_statuses import STATUS_CODES
from integrations.list_types import LABELS, REMOVED, file_name_pattern
from integrations.models.brokers import BrokerMode

# DROP list types, spelled as ``hash_type`` (docs/contracts.md §10.1), defined in
# integrations/list_types.py.
HASH_TYPE_CHOICES = list(LABELS.items())


class CycleState(models.TextChoices):
    OPEN = "open", "Open (statuses owed)"
    REPORTED = "reported", "Reported"
    NOTHING_OWED = "nothing_owed", "Nothing owed"


def cycle_may_have_outstanding() -> models.Exists:
    """On a query of cycles: those that may have work items in an outstanding state
    (``outstanding_status``), i.e. with an ``OutstandingCycle`` row. Every cycle that has
    such an item is among them; one left out has none, and costs no look at its work
    items. A probe for work items in a state (owed, reportable, awaiting an outcome...)
    over many cycles asks its exact question of these cycles only."""
    return models.Exists(OutstandingCycle.objects.filter(cycle=models.OuterRef("pk")))


class DropCycleQuerySet(models.QuerySet["DropCycle"]):
    def may_have_outstanding(self) -> DropCycleQuerySet:
        """Cycles that may have outstanding work items (``cycle_may_have_outstanding``)."""
        return self.filter(cycle_may_have_outstanding())


class DropCycle(models.Model):
    broker = models.ForeignKey(
        "integrations.Broker", on_delete=models.PROTECT, related_name="cycles"
    )
    drop_session_id = models.CharField("DROP session ID", max_length=20)
    zip_name = models.CharField("package", max_length=255)
    zip_sha256 = models.CharField("package SHA-256", max_length=64)
    downloaded_at = models.DateTimeField()
    match_date = models.DateField()
    due_date = models.DateField()
    state = models.CharField(max_length=16, choices=CycleState.choices, default=CycleState.OPEN)
    work_items = models.PositiveIntegerField(default=0)
    matched = models.PositiveIntegerField(default=0)
    not_found = models.PositiveIntegerField(default=0)
    removed = models.PositiveIntegerField(default=0)
    # Per list: downloaded file name -> row count, as in the ZIP (response files reuse names).
    files = models.JSONField(default=dict)
    # Per DROP list of the ZIP not read at all: file name -> why (a list type this version
    # does not know, a header that is not ID,Hash...). No status is reported for them.
    unread_files = models.JSONField(default=dict, blank=True)
    # Per such list, when its member could be read through: file name -> data rows. DROP
    # sent each as a request: they count as received in the yearly figures.
    unread_rows = models.JSONField(default=dict, blank=True)
    # Per list type, as matched at import: hash_type -> {"items": n, "matched": m}. Late
    # matches do not change it (like ``matched``): it is what the download met.
    match_rates = models.JSONField(default=dict, blank=True)
    # The broker's mode when the package was downloaded, fixed then: a cycle of DROP's
    # sandbox stays one when staff switch the broker to production, and only production
    # cycles count in the yearly figures. The database default is for the release before
    # 0070, which makes cycles without the column.
    mode = models.CharField(
        max_length=10, choices=BrokerMode.choices, db_default=BrokerMode.PRODUCTION.value
    )
    created_at = models.DateTimeField(db_default=Now())

    objects = DropCycleQuerySet.as_manager()

    class Meta:
        verbose_name = "DROP cycle"
        ordering = ["-downloaded_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "drop_session_id"], name="cycle_session_unique"
            ),
            models.UniqueConstraint(fields=["broker", "zip_sha256"], name="cycle_zip_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.broker.broker_id} cycle {self.drop_session_id}"


class WorkItemState(models.TextChoices):
    OPEN = "open", "Open"  # matched, outcomes pending
    REPORTABLE = "reportable", "Reportable"  # status known, DROP does not hold it yet
    REPORTED = "reported", "Reported"  # DROP holds it (accepted, or uploaded by hand)
    REMOVED = "removed", "Removed (consumer cancelled)"


# Which work items are in which case with DROP, each defined once: every count, filter and
# report run reads these (the queryset methods below name the same).


def outstanding_status() -> Q:
    """Work items whose current status DROP does not hold: none known yet (``open``), or one
    to send or to amend (``reportable``). Neither ``reported`` nor removed.

    Every cycle with such an item has its ``OutstandingCycle`` row (kept by the database,
    ``sql/outstanding_cycles.sql``): a probe for items in these states over many cycles
    first keeps the cycles ``DropCycleQuerySet.may_have_outstanding`` names."""
    return Q(state__in=[WorkItemState.OPEN, WorkItemState.REPORTABLE])


def owed_status() -> Q:
    """Work items DROP is owed a status for: outstanding, and no status of theirs taken by
    DROP yet (``reported_at`` is set only once DROP accepted a file with the item, or staff
    marked it uploaded by hand; a file written and not yet taken leaves it owed). An
    amendment owed is not a status owed: DROP holds one. The one definition every count of
    "owed" reads."""
    return outstanding_status() & Q(reported_at__isnull=True)


def no_status_held() -> Q:
    """Work items DROP holds no known code for: not removed, and no ``reported_status_code``.
    What the yearly figures and the evidence pack count as "no status yet", beside the code
    DROP holds. The rows ``owed_status`` names, as long as ``reported_at`` and
    ``reported_status_code`` are set together (``report_rows_taken``); a row with a time and
    no code (an amendment DROP rejected, from before migration 0029) counts here and is not
    owed."""
    return ~Q(state=WorkItemState.REMOVED) & Q(reported_status_code__isnull=True)


class WorkItemQuerySet(models.QuerySet["WorkItem"]):
    def outstanding(self) -> WorkItemQuerySet:
        """Work items whose current status DROP does not hold (``outstanding_status``)."""
        return self.filter(outstanding_status())

    def owed(self) -> WorkItemQuerySet:
        """Work items DROP is owed a status for (``owed_status``)."""
        return self.filter(owed_status())

    def no_status_held(self) -> WorkItemQuerySet:
        """Work items DROP holds no known code for (``no_status_held``)."""
        return self.filter(no_status_held())

    def awaiting_outcome(self) -> WorkItemQuerySet:
        """Matched work items whose status waits for their requests' outcomes."""
        return self.filter(state=WorkItemState.OPEN)

    def reportable(self) -> WorkItemQuerySet:
        """Work items with a status to write to DROP: a first one, or an amendment."""
        return self.filter(state=WorkItemState.REPORTABLE)

    def awaiting_amendment(self) -> WorkItemQuerySet:
        """Reportable work items whose status DROP holds a different code for."""
        return self.reportable().filter(needs_amendment=True)

    def where_sql(self, *, alias: str | None = None) -> tuple[str, list[Any]]:
        """This queryset's filter as a SQL condition and its parameters (``%s``), for a
        statement written by hand that must select the same rows (a set-based ``UPDATE``, an
        aggregate's ``FILTER``) rather than restate a case above: columns qualified by the
        table's name, or by ``alias``. A filter through another table is refused (a bare
        condition cannot carry its join), and so is a slice, a union or a distinct (a
        condition cannot say them either: the statement would touch other rows)."""
        query = self.query.clone()
        if query.is_sliced or query.combinator or query.distinct:
            raise ValueError("where_sql: a slice, union or distinct is not a condition")
        table = query.get_initial_alias()
        if any(query.alias_refcount[other] for other in query.alias_map if other != table):
            raise ValueError("where_sql: the filter joins another table")
        if alias is not None:
            query.change_aliases({table: alias})
        try:
            sql, params = query.get_compiler(using=self.db).compile(query.where)
        except FullResultSet:  # no filter
            return "TRUE", []
        except EmptyResultSet:  # a filter no row can meet (``none()``, ``pk__in=[]``)
            return "FALSE", []
        return sql, list(params)


class WorkItem(models.Model):
    id = models.BigAutoField(primary_key=True)
    # Indexed through the composite indexes below (every extra index slows the import).
    # No database check either: a foreign key check is a per-row trigger that every imported
    # row would pay (docs/benchmarks.md, DROP cycle import). The only writer, the
    # import (services.cycle.drop), takes both ids from the cycle it creates in the same
    # transaction; cycles and brokers are never deleted (PROTECT, and no delete in the admin).
    broker = models.ForeignKey(
        "integrations.Broker",
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    cycle = models.ForeignKey(
        DropCycle,
        on_delete=models.PROTECT,
        related_name="items",
        db_index=False,
        db_constraint=False,
    )
    # DROP documents 12 letters or digits; 1 to 64 are kept, and echoed back as sent.
    work_item_id = models.CharField("work item ID", max_length=64)
    hash_type = models.CharField(max_length=8, choices=HASH_TYPE_CHOICES)
    hash = models.BinaryField(max_length=32)
    file_name = models.CharField(max_length=255)
    state = models.CharField(
        max_length=12, choices=WorkItemState.choices, default=WorkItemState.OPEN
    )
    status_code = models.PositiveSmallIntegerField("DROP status", null=True, blank=True)
    status_reason = models.TextField(blank=True, default="")  # for a status set by staff
    # When staff set it: only an outcome recorded after gives way (work_item_settle.sql).
    status_set_at = models.DateTimeField(null=True, blank=True)
    # What DROP holds (reported_status_code, reported_at, report_file): set when DROP accepts
    # a file with the item (or staff mark one uploaded by hand), to the status written into
    # it (pending_status_code); a file written and not yet taken changes none of them.
    reported_status_code = models.PositiveSmallIntegerField(
        "DROP status reported", null=True, blank=True
    )
    reported_at = models.DateTimeField(null=True, blank=True)
    # When DROP first held a status for the item, set once: an amendment DROP takes moves
    # reported_at, never this. The days to respond count to it (selectors.drop_metrics).
    first_reported_at = models.DateTimeField(null=True, blank=True)
    # No database check either (nor on pending_report_file): reporting sets it on every row of
    # a cycle at once, and the deferred check ran once per row at commit (docs/benchmarks.md,
    # reporting). Its only writers (services.reporting.report_*) set it to a file of the
    # item's cycle; report files are never deleted (PROTECT, and no delete in the admin).
    report_file = models.ForeignKey(
        "integrations.ReportFile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    needs_amendment = models.BooleanField(default=False)
    # The file the item was last written into that DROP has not taken: waiting for DROP's
    # answer (written or refused), or rejected (its rows wait for staff). A run never writes
    # the item into another file meanwhile; cleared when DROP takes the file (report_file
    # then) or staff give up the amendment.
    pending_report_file = models.ForeignKey(
        "integrations.ReportFile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    # The status written into pending_report_file: what DROP holds once it takes the file
    # (the item's status may change meanwhile).
    pending_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    objects = WorkItemQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cycle", "work_item_id"], name="work_item_unique"),
            models.CheckConstraint(
                condition=models.Q(status_code__isnull=True)
                | models.Q(status_code__in=STATUS_CODES),
                name="work_item_status_code_valid",
            ),
        ]
        indexes = [
            # Late matches: a newly registered consumer hash against every kept hash, by
            # equality only. A hash index rather than a B-tree on (broker, hash): its entries
            # are 4-byte hash codes, not 41-byte keys compared byte by byte, and an insert
            # goes straight to its bucket, so the import pays less for it
            # (docs/benchmarks.md, DROP cycle import). The broker is checked on the row.
            HashIndex(fields=["hash"], name="work_item_hash"),
            models.Index(fields=["broker", "work_item_id"], name="work_item_broker_id"),
            # No index holds ``state``: marking a cycle's items reported, or settling them,
            # is then a HOT update that touches no index (with the fill factor of 60 that
            # migration 0052 sets, docs/benchmarks.md, reporting). Which cycles have items
            # in a state is asked of OutstandingCycle first.
        ]

    def __str__(self) -> str:
        return self.work_item_id


class OutstandingCycle(models.Model):
    """A cycle that may have outstanding work items (``outstanding_status``): every cycle
    with one has its row; a row whose cycle has none is allowed, and only costs its
    readers the exact query on that cycle.

    Kept by the database, not by the services: triggers on the work items mark a cycle as
    rows come in or go back to ``open`` or ``reportable``, whoever writes them
    (``sql/outstanding_cycles.sql``); a periodic job clears the rows of
    cycles with nothing outstanding (``services.cycle.outstanding.outstanding_cycles_clear``)."""

    # No database check on the cycle: it would take a KEY SHARE lock on the cycle's row,
    # which the report's and the cycle state's SELECT ... FOR UPDATE of the cycle wait on
    # while holding work items a settlement may be marking from: a deadlock. Cycles are
    # never deleted (PROTECT, and no delete in the admin).
    cycle = models.OneToOneField(
        DropCycle,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="+",
        db_constraint=False,
    )

    def __str__(self) -> str:
        return f"cycle {self.cycle_id} may have outstanding work items"


# The name of a Removed file (docs/contracts.md §10.1), as the import keeps it.
_REMOVED_FILE_NAME = f"^{file_name_pattern(REMOVED)}$"


class UnreadableWorkItemQuerySet(models.QuerySet["UnreadableWorkItem"]):
    def latest_package(self) -> UnreadableWorkItemQuerySet:
        """Unreadable rows of the broker's latest package: staff's to look at (``drop
        doctor``). DROP sends the next package only once every work item of the last one has
        a status, so the next one settles them."""
        # Imported later (a greater pk): the next package DROP sent.
        later = DropCycle.objects.filter(
            broker=models.OuterRef("broker"), pk__gt=models.OuterRef("cycle_id")
        )
        return self.exclude(models.Exists(later))

    def owed(self) -> UnreadableWorkItemQuerySet:
        """Unreadable rows still owed a status (staff answer them in DROP's portal): those
        of the broker's latest package, but for two kinds that owe nothing of their own: a
        row of the Removed file (no status is owed for a removed identifier), and a row
        repeating word for word one read as a work item of the same list (the status of that
        id, which its work item owes, answers both)."""
        line_read = WorkItem.objects.filter(
            cycle=models.OuterRef("cycle_id"),
            work_item_id=models.OuterRef("work_item_id"),
            file_name=models.OuterRef("file_name"),
        ).annotate(
            line=Concat(
                "work_item_id",
                Value(","),
                Func(F("hash"), Value("base64"), function="encode", output_field=TextField()),
                output_field=TextField(),
            )
        )
        return (
            self.latest_package()
            .exclude(file_name__regex=_REMOVED_FILE_NAME)
            .exclude(models.Exists(line_read.filter(line=models.OuterRef("text"))))
        )


class UnreadableWorkItem(models.Model):
    """A row of a downloaded list that could not be read as a work item (an id or a hash of
    another shape, a field too many...). Kept as found, so staff can answer it in DROP's
    portal; never matched nor reported, since what DROP meant by it is unknown."""

    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    cycle = models.ForeignKey(DropCycle, on_delete=models.PROTECT, related_name="unreadable_items")
    file_name = models.CharField(max_length=255)
    line = models.PositiveIntegerField()
    work_item_id = models.CharField(max_length=64, blank=True)  # the first field as found
    text = models.CharField(max_length=255)  # the line as found, cut short, escaped
    reason = models.CharField(max_length=255)
    created_at = models.DateTimeField(db_default=Now())

    objects = UnreadableWorkItemQuerySet.as_manager()

    class Meta:
        ordering = ["cycle", "file_name", "line"]
        constraints = [
            models.UniqueConstraint(
                fields=["cycle", "file_name", "line"], name="unreadable_item_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.file_name} line {self.line}"
