"""The staff dashboard (admin index): a handful of aggregate queries for every broker at
once; nothing here loops over rows."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Count, F, Max, OuterRef, Q, Subquery, Window
from django.db.models.functions import Coalesce, RowNumber

from integrations.drop.calendar import drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    CycleState,
    DeletionRequest,
    DeliveryAttempt,
    DropAccessObligation,
    DropCycle,
    Integration,
    LedgerEvent,
    ReportFile,
    RequestState,
    UnreadableWorkItem,
    WorkItem,
    WorkItemState,
    owed_status,
)
from integrations.selectors.directives import (
    directives_ack_overdue_before,
    unacknowledged_directives_count,
)
from integrations.selectors.drop_access import drop_access_obligations_open
from integrations.selectors.pulls import brokers_with_last_downloads
from integrations.selectors.recurring import (
    RecurringOverview,
    recurring_overviews,
    recurring_overviews_counted,
)
from integrations.selectors.requests import deletion_requests_needing_attention
from integrations.selectors.targets import broker_targets

# Integration health looks at this many of the latest delivery attempts (by id, which grows
# with time): the attempts table keeps every attempt for good, the dashboard must not.
HEALTH_ATTEMPTS = 100_000
DASHBOARD_RECENT_CYCLES = 8


@dataclass(frozen=True)
class CycleWorkItems:
    """A cycle, how many of its work items are in each (state, status_code) and how many
    DROP is still owed a status for (``WorkItem.objects.owed()``) (open cycles only), and
    how many of its deletion requests ended with each broker outcome ("" while none came
    back)."""

    cycle: DropCycle
    counts: dict[tuple[str, int | None], int]
    request_outcomes: dict[str, int] = field(default_factory=dict)
    still_owed: int = 0
    # Its unreadable rows still owed a status (``UnreadableWorkItem.objects.owed()``).
    unreadable_owed: int = 0

    @property
    def owed(self) -> int:
        """The statuses DROP is still owed, as the deadlines count them (``cycle_deadlines``):
        an open cycle owing none waits only for an amendment, and is late for nothing."""
        return self.still_owed + self.unreadable_owed

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_status(self) -> dict[int | None, int]:
        """Work items not removed (a removed one has no status, and none is owed for it), by
        status code (None: unknown)."""
        totals: dict[int | None, int] = {}
        for (state, status_code), n in self.counts.items():
            if state != WorkItemState.REMOVED:
                totals[status_code] = totals.get(status_code, 0) + n
        return totals

    @property
    def not_removed(self) -> int:
        """Work items not removed: every one DROP has, or will have, a status of ours for.
        Not what DROP is owed now (``still_owed``, ``WorkItem.objects.owed()``): that leaves
        out the ones DROP holds a status for."""
        return sum(self.by_status().values())

    @property
    def with_status(self) -> int:
        return sum(n for code, n in self.by_status().items() if code is not None)

    @property
    def reported(self) -> int:
        """Work items DROP holds a status for (it accepted a file with them, or staff marked
        one uploaded by hand); an amendment may still be owed for some."""
        return self.not_removed - self.still_owed


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
    # The last pull DROP answered (a package, or "nothing new": the broker downloaded as the
    # law asks all the same).
    last_pulled_at: dt.datetime | None
    last_upload_at: dt.datetime | None
    # The last pull from DROP, when it failed and nothing was pulled or imported since
    # (a 401/403 from DROP lands here: staff must act).
    failed_pull: LedgerEvent | None = None
    # The periodic stuck check's last result that changed (``services.staff.doctor``), if any.
    doctor: LedgerEvent | None = None
    # DROP outages of more than a day whose notice to CalPrivacy is not recorded yet.
    drop_access_obligations: list[DropAccessObligation] = field(default_factory=list)
    # Directives to service providers not acknowledged yet, and of those the overdue.
    directives_awaiting: int = 0
    directives_overdue: int = 0
    # Recurring deletion rounds: due, sent, answered, failing (``selectors.recurring``), and
    # when the worker counted them (``counted_at``; None: just now).
    recurring: RecurringOverview | None = None


# The events that say how the broker's last download went.
_PULL_OUTCOME_KINDS = (
    LedgerKind.DROP_PULLED,
    LedgerKind.DROP_CYCLE_IMPORTED,
    LedgerKind.DROP_PULL_FAILED,
)


def dashboard_overview(*, now: dt.datetime) -> list[BrokerOverview]:
    """Everything the dashboard shows, per broker, in a fixed number of queries whatever the
    data size."""
    brokers = _brokers_with_last_transfers(now=now)
    recent, shown = _recent_and_open_cycles()
    recent_ids = {cycle.pk for cycle in recent}
    cycles_of = _cycle_work_items_by_broker(recent, shown)
    attention = _attention_by_broker(now=now)
    health_of = _integration_health_by_broker()
    # The worker's counts while fresh; else the schedule read live (it grows with every
    # deleted consumer): a fresh install, a stopped worker, a broker added since.
    recurring = recurring_overviews_counted(broker_pks=[b.pk for b in brokers], now=now)
    if recurring is None:
        recurring = recurring_overviews(today=drop_today(now))
    latest = _latest_events_by_broker([*_PULL_OUTCOME_KINDS, LedgerKind.DROP_DOCTOR_CHECKED])
    obligations_of: dict[int, list[DropAccessObligation]] = {}
    for obligation in drop_access_obligations_open():
        obligations_of.setdefault(obligation.broker_id, []).append(obligation)

    overviews = []
    for broker in brokers:
        events = latest.get(broker.broker_id, {})
        pull_event = max(
            (events[kind] for kind in _PULL_OUTCOME_KINDS if kind in events),
            key=lambda event: event.pk,
            default=None,
        )
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
                last_pulled_at=broker.last_pull_reached_at,  # type: ignore[attr-defined]
                last_upload_at=broker.last_upload_at,  # type: ignore[attr-defined]
                failed_pull=pull_event
                if pull_event and pull_event.kind == LedgerKind.DROP_PULL_FAILED
                else None,
                doctor=events.get(LedgerKind.DROP_DOCTOR_CHECKED),
                drop_access_obligations=obligations_of.get(broker.pk, []),
                directives_awaiting=broker.directives_awaiting,  # type: ignore[attr-defined]
                directives_overdue=broker.directives_overdue,  # type: ignore[attr-defined]
                recurring=recurring.get(
                    broker.pk, RecurringOverview(settings.DROPPORTAL_RECURRING_DAYS, 0, 0, 0, 0, 0)
                ),
            )
        )
    return overviews


def _brokers_with_last_transfers(*, now: dt.datetime) -> list[Broker]:
    """Every broker, annotated with ``last_download_at``, ``last_pull_reached_at`` (the last
    pull that reached DROP: ``brokers_with_last_downloads``), ``last_upload_at`` and its
    directives awaiting acknowledgement (``directives_awaiting``, ``directives_overdue``)."""
    return list(
        brokers_with_last_downloads()
        .annotate(
            last_upload_at=Subquery(
                ReportFile.objects.filter(broker=OuterRef("pk"), uploaded_at__isnull=False)
                .order_by("-uploaded_at")
                .values("uploaded_at")[:1]
            ),
            directives_awaiting=unacknowledged_directives_count(),
            directives_overdue=unacknowledged_directives_count(
                issued_before=directives_ack_overdue_before(now=now)
            ),
        )
        .order_by("broker_id")
    )


def _recent_and_open_cycles() -> tuple[list[DropCycle], list[DropCycle]]:
    """Each broker's latest ``DASHBOARD_RECENT_CYCLES`` cycles, and those plus every open
    cycle (the cycles the dashboard shows)."""
    recent: list[DropCycle] = list(
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
    return recent, shown


def _cycle_work_items_by_broker(
    recent: list[DropCycle], shown: list[DropCycle]
) -> dict[int, list[CycleWorkItems]]:
    """The shown cycles with their work item counts and request outcomes, by broker pk."""
    # Work items are counted for open cycles only: a closed cycle's are all reported, and a
    # DROP list is mostly unmatched items, so counting every recent cycle's would cost the
    # page most of its time.
    opened = [c.pk for c in shown if c.state == CycleState.OPEN]
    counts, still_owed, unreadable = work_item_counts(opened)
    outcomes = _request_outcomes(recent)
    cycles_of: dict[int, list[CycleWorkItems]] = {}
    for cycle in shown:
        cycles_of.setdefault(cycle.broker_id, []).append(
            CycleWorkItems(
                cycle,
                counts.get(cycle.pk, {}),
                outcomes.get(cycle.pk, {}),
                still_owed.get(cycle.pk, 0),
                unreadable.get(cycle.pk, 0),
            )
        )
    return cycles_of


def work_item_counts(
    cycle_pks: list[int],
) -> tuple[dict[int, dict[tuple[str, int | None], int]], dict[int, int], dict[int, int]]:
    """Per cycle pk: how many work items are in each (state, status_code), how many DROP is
    still owed a status for (``WorkItem.objects.owed()``), and how many of its unreadable
    rows are (``UnreadableWorkItem.objects.owed()``). One GROUP BY over the cycles' rows
    (the (cycle, work item id) index), and one over their unreadable rows; for
    ``CycleWorkItems``."""
    counts: dict[int, dict[tuple[str, int | None], int]] = {pk: {} for pk in cycle_pks}
    still_owed = dict.fromkeys(cycle_pks, 0)
    for row in (
        WorkItem.objects.filter(cycle_id__in=cycle_pks)
        .values("cycle_id", "state", "status_code")
        .annotate(n=Count("id"), owed=Count("id", filter=owed_status()))
        .order_by()
    ):
        counts[row["cycle_id"]][(row["state"], row["status_code"])] = row["n"]
        still_owed[row["cycle_id"]] += row["owed"]
    unreadable_owed = dict.fromkeys(cycle_pks, 0)
    unreadable_owed.update(
        UnreadableWorkItem.objects.owed()
        .filter(cycle_id__in=cycle_pks)
        .values("cycle_id")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("cycle_id", "n")
    )
    return counts, still_owed, unreadable_owed


def _request_outcomes(recent: list[DropCycle]) -> dict[int, dict[str, int]]:
    """Per recent cycle pk: how many of the match's own deletion requests (round 0) ended
    with each outcome; a recurring round's carry the cycle's session too, and would add
    their answers to the match's every 45 days."""
    # A request carries its cycle's drop_session_id: no join back to the work items.
    cycle_of_session = {(c.broker_id, c.drop_session_id): c.pk for c in recent}
    outcomes: dict[int, dict[str, int]] = {c.pk: {} for c in recent}
    for broker_pk, session, drop_outcome, n in (
        DeletionRequest.objects.filter(
            drop_session_id__in={c.drop_session_id for c in recent}, round=0
        )
        .exclude(state=RequestState.CANCELLED)
        .values("broker_id", "drop_session_id", "drop_outcome")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("broker_id", "drop_session_id", "drop_outcome", "n")
    ):
        cycle_pk = cycle_of_session.get((broker_pk, session))
        if cycle_pk is not None:
            outcomes[cycle_pk][drop_outcome] = n
    return outcomes


def _attention_by_broker(*, now: dt.datetime) -> dict[int, RequestsNeedingAttention]:
    return {
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


def _integration_health_by_broker() -> dict[int, list[IntegrationHealth]]:
    """Every integration's delivery health, by broker pk (integrations by name). A retired
    one is left out: it is gone for good, nothing waits for it."""
    health, looked_at_all = integration_delivery_health()
    health_of: dict[int, list[IntegrationHealth]] = {}
    for integration in broker_targets(None, retired=False):
        last_success_at, failures = health.get(integration.pk, (None, 0))
        health_of.setdefault(integration.broker_id, []).append(
            IntegrationHealth(
                integration=integration,
                last_success_at=last_success_at,
                failures_in_a_row=failures,
                complete=looked_at_all or last_success_at is not None,
            )
        )
    return health_of


def _latest_events_by_broker(kinds: list[LedgerKind]) -> dict[str, dict[str, LedgerEvent]]:
    """Each broker's latest ledger event of each of ``kinds``, by DROP broker id and kind,
    in one query."""
    found: dict[str, dict[str, LedgerEvent]] = {}
    events = LedgerEvent.objects.filter(kind__in=kinds)
    for event in events.order_by("broker_id", "kind", "-id").distinct("broker_id", "kind"):
        found.setdefault(event.broker_id, {})[event.kind] = event
    return found


def _succeeded() -> Q:
    return Q(status__gte=200, status__lt=300)


def _failed() -> Q:
    return Q(status__isnull=True) | Q(status__lt=200) | Q(status__gte=300)


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
