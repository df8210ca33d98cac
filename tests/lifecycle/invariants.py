"""The invariants of the lifecycle model (``test_lifecycle_model.py``): what must hold after
every step of a random history, as that module's docstring lists them."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

from django.db import connection
from django.db.models import Exists, QuerySet
from hypothesis import event
from hypothesis.stateful import invariant

from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    OutstandingCycle,
    Reappearance,
    ReportFile,
    ReportFileState,
    ReportKind,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.stuck import StuckReason, stuck_work_items
from integrations.services.ledger import ledger_seal, ledger_verify
from tests.lifecycle.harness import QUEUED_DELIVERIES, ModelDrop, World, json_value, report_rows
from tests.lifecycle.oracle import Oracle

# What an invariant reads: a queryset, or SQL and its parameters.
Read: TypeAlias = "QuerySet[Any, Any] | tuple[str, Sequence[Any]]"


def _read_together(reads: dict[str, tuple[str, Sequence[Any]]]) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of each of ``reads`` (SQL and parameters), by name, in one round trip: the
    statements in one string, their results read in turn."""
    if not reads:
        return {}
    names = list(reads)
    with connection.cursor() as cursor:
        cursor.execute(
            "; ".join(reads[name][0] for name in names),
            [param for name in names for param in reads[name][1]],
        )
        found = {names[0]: cursor.fetchall()}
        for name in names[1:]:
            cursor.nextset()
            found[name] = cursor.fetchall()
    return found


def _live(pk: int, state: str, enabled: bool, queued_jobs: set[int]) -> bool:
    """A path to an outcome that needs no one: a delivery on its way, or the broker's."""
    if state == RequestState.QUEUED:
        return enabled and pk in queued_jobs
    # dispatched: the broker has it, its callback is awaited (doctor lists it after 7 days).
    # failed (waiting for staff: the automatic policy is off by default), pending,
    # undeliverable, cancelled or completed: no.
    return state == RequestState.DISPATCHED


def _stuck_reasons(requests: list[tuple[int, str, bool]]) -> set[str]:
    """The ``drop doctor`` reasons a stuck item's requests give, as the operator docs name
    them; none: nothing would tell staff about it."""
    reasons = set()
    for _, state, enabled in requests:
        if state == RequestState.PENDING:
            reasons.add("pending_without_target")
        elif state in (RequestState.QUEUED, RequestState.FAILED) and not enabled:
            reasons.add("target_disabled")
        elif state == RequestState.FAILED:
            reasons.add("failed_waiting_for_staff")
        elif state == RequestState.UNDELIVERABLE:
            reasons.add("undeliverable")
    return reasons


def doctor_counts(broker: Broker, reasons: Iterable[str]) -> dict[str, int]:
    """Work items ``drop doctor`` lists for ``broker`` for each of ``reasons``: the groups
    of the others are not read (each reason's groups are the same either way)."""
    return {
        str(group.reason): group.work_items
        for group in stuck_work_items(
            broker=broker,
            now=dt.datetime.now(dt.UTC),
            reasons={StuckReason(reason) for reason in reasons},
        )
    }


class LifecycleInvariants:
    """The checks of the lifecycle model, after every step (the report files after every
    report run, the ledger after the last step). Mixed into ``LifecycleMachine``, whose state
    they read."""

    world: World
    drop: ModelDrop
    oracle: Oracle
    broker: Broker
    step: int
    seen_files: dict[int, list[tuple[str, int]]]

    def check_invariants(self, *args: Any, **kwargs: Any) -> None:
        """Hypothesis checks the invariants after each step: their reads are made anew."""
        vars(self)["_step_rows"] = None
        super().check_invariants(*args, **kwargs)  # type: ignore[misc]

    def _read(self, name: str, query: Callable[[], Read]) -> list[tuple[Any, ...]]:
        """The rows of ``query`` (a queryset, or SQL and its parameters) after this step.

        Each query an invariant asks is built and compiled once per example (a machine: one
        broker; the ORM took longer to compile them than PostgreSQL to answer them), and at
        the first read of each step all of them run in one round trip: the invariants write
        nothing another reads (a seal adds chain links, read before it). Rows come as the
        driver gives them (jsonb as text: ``json_value``). Kept on the machine but not set in
        its ``__init__``: the machine's source seeds its histories."""
        state = vars(self)
        compiled: dict[str, tuple[str, Sequence[Any]]] = state.setdefault("_compiled_reads", {})
        rows: dict[str, list[tuple[Any, ...]]] | None = state.get("_step_rows")
        if rows is None:
            rows = state["_step_rows"] = _read_together(compiled)
        if name not in rows:  # first asked in this example
            read = query()
            compiled[name] = read if isinstance(read, tuple) else read.query.sql_with_params()
            rows.update(_read_together({name: compiled[name]}))
        return rows[name]

    def _note_dispatches(self) -> None:
        raise NotImplementedError  # the machine notes what reached the broker

    def _check_new_files(self) -> None:
        """Every status written for DROP is the oracle's, and no item twice in one list."""
        for report_file in ReportFile.objects.exclude(pk__in=self.seen_files).order_by("pk"):
            rows = report_rows(bytes(report_file.content))
            self.seen_files[report_file.pk] = rows
            self.world.seen[f"report file {report_file.kind}"] += 1
            event(f"report file {report_file.kind} {report_file.state}")
            if report_file.kind == ReportKind.AMEND:
                self.world.seen["rows amended"] += len(rows)
            for work_item_id, code in rows:
                item = self.oracle.items[work_item_id]
                assert item.removed_at_step is None, f"{work_item_id} written after its removal"
                owing = [u for u in sorted(item.targets) if self.oracle.owes(item, u)]
                assert not owing, (
                    f"{report_file.file_name} says {work_item_id} is {code} while integration(s)"
                    f" {owing} owe an answer: {[self.oracle.requests[u] for u in item.requests]}"
                )
                expected = self.oracle.expected(item)
                assert code == expected, (
                    f"{report_file.file_name} ({report_file.kind}) says {work_item_id} is"
                    f" {code}; the oracle says {expected}:"
                    f" {[self.oracle.requests[u] for u in sorted(item.requests)]}"
                )
        self._check_no_item_twice()

    def _check_no_item_twice(self) -> None:
        files = {
            f.pk: f
            for f in ReportFile.objects.filter(pk__in=self.seen_files).only(
                "pk", "kind", "state", "file_name"
            )
        }
        written: dict[str, list[tuple[str, int, str]]] = {}
        for pk in sorted(files):
            report_file = files[pk]
            if report_file.state in (ReportFileState.REJECTED, ReportFileState.DISCARDED):
                continue  # DROP never had it; its rows were written again or given up
            for work_item_id, code in self.seen_files[pk]:
                written.setdefault(work_item_id, []).append(
                    (report_file.kind, code, report_file.file_name)
                )
        for work_item_id, rows in written.items():
            kind, code, name = rows[0]
            assert kind == ReportKind.UPLOAD, f"{work_item_id} amended before any upload: {rows}"
            for later_kind, later_code, later_name in rows[1:]:
                assert later_kind == ReportKind.AMEND, (
                    f"{work_item_id} uploaded twice: {name} and {later_name}"
                )
                assert later_code != code, f"{work_item_id} amended to the same {code}: {rows}"
                code, name = later_code, later_name

    # -- the invariants -------------------------------------------------------------------

    @invariant()
    def count_step(self) -> None:
        self.step += 1
        self.world.steps += 1

    @invariant()
    def nothing_sent_for_removed_items(self) -> None:
        self._note_dispatches()
        assert not self.drop.amended_unheld, (
            f"amended although DROP never accepted a status: {self.drop.amended_unheld}"
        )

    @invariant()
    def no_matched_item_silently_stuck(self) -> None:
        """Every matched, not removed item without a status has a live request, or is
        listed by ``drop doctor``."""
        # The items and their requests in one query (an item with none: one row of NULLs).
        rows = self._read(
            "without status",
            lambda: (
                WorkItem.objects.filter(broker=self.broker, status_code__isnull=True)
                .exclude(state=WorkItemState.REMOVED)
                .values_list(
                    "pk",
                    "work_item_id",
                    "deletion_requests__pk",
                    "deletion_requests__state",
                    "deletion_requests__integration__enabled",
                )
            ),
        )
        if not rows:
            return
        without_status: dict[int, str] = {}
        requests: dict[int, list[tuple[int, str, bool]]] = {}
        for item_pk, work_item_id, pk, state, enabled in rows:
            without_status[item_pk] = work_item_id
            item_requests = requests.setdefault(item_pk, [])
            if pk is not None:
                item_requests.append((pk, state, bool(enabled)))
        queued_jobs = {
            pk
            for (args,) in self._read("queued deliveries", lambda: QUEUED_DELIVERIES)
            for pk in json_value(args)["request_ids"]
        }
        stuck = {
            without_status[item_pk]: item_requests
            for item_pk, item_requests in requests.items()
            if not any(_live(*request, queued_jobs) for request in item_requests)
            and self.oracle.items[without_status[item_pk]].removed_at_step is None
        }
        if not stuck:
            return
        # Each stuck item must be in a group of the doctor for a reason its requests give:
        # the doctor counts work items per reason, so per reason it lists at least these.
        by_reason: Counter[str] = Counter()
        for work_item_id, item_requests in stuck.items():
            reasons = _stuck_reasons(item_requests)
            assert reasons, (
                f"{work_item_id} has no status, no live request, and no reason drop doctor"
                f" knows: [(request, state, integration enabled)] = {item_requests}"
            )
            by_reason.update(reasons)
        listed = doctor_counts(self.broker, by_reason)
        for reason, n in by_reason.items():
            assert listed.get(reason, 0) >= n, (
                f"drop doctor lists {listed.get(reason, 0)} work items as {reason}, {n} are:"
                f" {stuck}"
            )
        self.world.seen["stuck, listed by drop doctor"] += len(stuck)

    @invariant()
    def reported_status_is_what_drop_holds(self) -> None:
        """What DROP took stays the item's reported status: a rejected or discarded
        amendment puts back the one DROP holds; only a file DROP has not answered for good
        may carry another."""
        if not self.drop.held:
            return
        # Every item of the broker's, those DROP holds picked here: one query for the example.
        for work_item_id, reported, file_state in self._read(
            "reported",
            lambda: WorkItem.objects.filter(broker=self.broker).values_list(
                "work_item_id", "reported_status_code", "report_file__state"
            ),
        ):
            if work_item_id not in self.drop.held or file_state in (
                ReportFileState.WRITTEN,
                ReportFileState.REFUSED,
            ):
                continue
            assert reported == self.drop.held[work_item_id], (
                f"{work_item_id}: reported {reported}, DROP holds"
                f" {self.drop.held[work_item_id]} ({file_state})"
            )

    @invariant()
    def a_round_never_changes_the_status(self) -> None:
        """An item that had a recurring round keeps the status its match's outcomes give,
        whatever the broker answered the round."""
        rounds = {wid: item for wid, item in self.oracle.items.items() if item.rounds}
        if not rounds:
            return
        # A reappearance's request (round 0) the broker has not received: open all the same.
        unreceived = {
            str(work_item_id)
            for work_item_id, uuid in DeletionRequest.objects.filter(
                broker=self.broker,
                round=0,
                work_item__work_item_id__in=[w for w, i in rounds.items() if i.reappeared_by],
            )
            .exclude(state=RequestState.CANCELLED)
            .values_list("work_item__work_item_id", "request_uuid")
            if str(uuid) not in rounds[work_item_id].requests
        }
        for work_item_id, code, state in WorkItem.objects.filter(
            broker=self.broker, work_item_id__in=list(rounds)
        ).values_list("work_item_id", "status_code", "state"):
            if state == WorkItemState.REMOVED:
                continue
            expected = self.oracle.stored_statuses(
                rounds[work_item_id], unreceived=work_item_id in unreceived
            )
            assert code in expected, (
                f"{work_item_id} has status {code} after {rounds[work_item_id].rounds} recurring"
                f" round(s); its match's outcomes give {expected}"
            )

    @invariant()
    def every_reappearance_recorded_once(self) -> None:
        """A registration that matches an item matched before records one reappearance per
        (item, new consumer), on the ledger too; the same consumer again records none."""
        recorded = self._read(
            "reappearances",
            lambda: Reappearance.objects.filter(broker=self.broker).values_list(
                "work_item__work_item_id", "remote_identifier"
            ),
        )
        assert len(recorded) == self.oracle.reappearances, (
            f"{len(recorded)} reappearances recorded, the oracle counts"
            f" {self.oracle.reappearances}: {recorded}"
        )
        for work_item_id, pointer in recorded:
            item = self.oracle.items[work_item_id]
            assert pointer in item.reappeared_by, (
                f"{work_item_id} reappeared under {pointer}; the oracle has {item.reappeared_by}"
            )
        on_ledger = sum(
            int(json_value(data)["reappearances"])
            for (data,) in self._read(
                "reappearances on the ledger",
                lambda: LedgerEvent.objects.filter(
                    broker_id=self.broker.broker_id, kind=LedgerKind.CONSUMERS_REAPPEARED
                ).values_list("data"),
            )
        )
        assert on_ledger == len(recorded), f"{on_ledger} on the ledger, {len(recorded)} recorded"

    @invariant()
    def every_outstanding_item_has_its_cycle_marked(self) -> None:
        """Every open or reportable item's cycle has its ``OutstandingCycle`` row, whatever
        wrote the item (the readers pass an unmarked cycle by); the report job forgets the
        others."""

        def marked() -> QuerySet[OutstandingCycle]:
            return OutstandingCycle.objects.filter(cycle__broker=self.broker)

        unmarked = self._read(
            "outstanding, unmarked",
            lambda: (
                WorkItem.objects.outstanding()
                .filter(broker=self.broker)
                .exclude(cycle_id__in=marked().values("cycle_id"))
                .values_list("work_item_id", "state")
            ),
        )
        assert not unmarked, f"outstanding in a cycle not marked: {unmarked}"
        # The run's figure, read in one query (this runs after every step).
        ((items, any_marked),) = self._read(
            "any item, any marked",
            lambda: Broker.objects.filter(pk=self.broker.pk).values_list(
                Exists(WorkItem.objects.filter(broker=self.broker)), Exists(marked())
            ),
        )
        if items and not any_marked:
            self.world.seen["every cycle forgotten, nothing outstanding"] += 1

    @invariant()
    def redispatch_marked_as_the_ledger_says(self) -> None:
        """A request's ``redispatched_at`` (the callbacks' stale-failure rule reads it) is set
        exactly when its latest redispatch or redelivery on the ledger is a redispatch: what
        migration 0056 filled the older rows from."""
        latest = dict(  # by request uuid, the later event overwriting the earlier
            self._read(
                "redispatches on the ledger",
                lambda: (
                    LedgerEvent.objects.filter(
                        kind__in=[
                            LedgerKind.DELETION_REQUEST_REDISPATCHED,
                            LedgerKind.DELETION_REQUEST_REDELIVERY_REQUESTED,
                        ]
                    )
                    .order_by("id")
                    .values_list("subject", "kind")
                ),
            )
        )
        redispatched = {
            uuid
            for uuid, kind in latest.items()
            if kind == LedgerKind.DELETION_REQUEST_REDISPATCHED
        }
        marked = {
            str(uuid)
            for (uuid,) in self._read(
                "marked redispatched",
                lambda: DeletionRequest.objects.filter(redispatched_at__isnull=False).values_list(
                    "request_uuid"
                ),
            )
        }
        assert marked == redispatched, (
            f"marked, not so on the ledger: {marked - redispatched};"
            f" the other way: {redispatched - marked}"
        )
        if marked:
            self.world.seen["a request marked redispatched"] += 1

    @invariant()
    def ledger_sealed(self) -> None:
        """After every step that wrote to the ledger: the chain grows in as many batches as
        a history has. (A step that wrote none would seal nothing: no batch.)"""
        if self._read(
            "any event unsealed",
            lambda: LedgerEvent.objects.filter(chain_link__isnull=True).values_list("pk")[:1],
        ):
            ledger_seal()

    def ledger_verifies(self) -> None:
        """At the end of a history (``teardown``): the ledger is append-only, so a break made
        by any step is still there then; verifying after every step cost a third of the run."""
        ledger_seal()
        verification = ledger_verify()
        assert verification.ok, verification
