"""The staff dashboard: every broker's cycle at a glance, each number a link to its list.

``DropportalAdminSite.index`` renders ``templates/admin/index.html`` with this context::

    dashboard_context(request)  # {"dashboard": Dashboard(...)}

The numbers come from ``selectors.dashboard.dashboard_overview`` (a few aggregate queries);
this module only shapes them for the template: links to the filtered admin changelists (when
the list exists and the user may see it) and the SVG charts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from integrations.admin import charts
from integrations.client_address import proxy_setting_missing
from integrations.dispatch.checks import PRIVATE_TARGETS_OPEN
from integrations.drop.calendar import drop_clock_text, drop_date, drop_time_text, drop_today
from integrations.drop_statuses import DropStatus
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    DROP_STATUS_CODES,
    CanaryRound,
    DropOutcome,
    RequestState,
    WorkItemState,
)
from integrations.selectors.canaries import FAILED, OPEN, PASSED, canary_round_results
from integrations.selectors.dashboard import (
    HEALTH_ATTEMPTS,
    BrokerOverview,
    CycleWorkItems,
    dashboard_overview,
)
from integrations.selectors.ledger_anchors import ledger_anchor_status
from integrations.selectors.pulls import download_due_date
from integrations.selectors.recurring import RECURRING_OVERDUE_DAYS
from integrations.selectors.requests import AWAITING_CALLBACK_ATTENTION

# Shown while this very page came through a proxy on this machine with the setting off.
PROXY_SETTING_MISSING = (
    "This page came through a proxy on this machine (X-Forwarded-For from loopback) but "
    "DROPPORTAL_BEHIND_TLS_PROXY is off: every client counts as the proxy's address, so one "
    "client's wrong passwords lock every staff member out. Set DROPPORTAL_BEHIND_TLS_PROXY=true."
)


@dataclass(frozen=True)
class Outcome:
    """A DROP status as the dashboard shows it (``code`` None: no status yet)."""

    code: int | None
    name: str
    color: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.code})" if self.code else self.name


# Bottom-up order of the stacked bars, the legend's order; the statuses and their names
# are DropStatus's.
STATUS_COLORS = {
    DropStatus.DELETED: "#2563eb",
    DropStatus.OPTED_OUT: "#7c3aed",
    DropStatus.EXEMPT: "#d97706",
    DropStatus.NOT_FOUND: "#94a3b8",
}
OUTCOMES = (
    *(Outcome(status.value, status.label, color) for status, color in STATUS_COLORS.items()),
    Outcome(None, "No status yet", "#cbd5e1"),
)


@dataclass(frozen=True)
class BrokerOutcome:
    """A deletion request's ``drop_outcome`` as the chart shows it ("": no answer yet)."""

    value: str
    label: str
    color: str


# Bottom-up order of the outcome bars: each final outcome in its DROP status's place, with
# its name and colour.
_OUTCOME_OF_STATUS = {code: outcome for outcome, code in DROP_STATUS_CODES.items()}
BROKER_OUTCOMES = (
    *(
        BrokerOutcome(_OUTCOME_OF_STATUS[status], status.label, color)
        for status, color in STATUS_COLORS.items()
    ),
    BrokerOutcome(DropOutcome.FAILED.value, DropOutcome.FAILED.label, "#dc2626"),
    BrokerOutcome("", "No answer yet", "#cbd5e1"),
)
UNCANCELLED = ",".join(s for s in RequestState.values if s != RequestState.CANCELLED)


@dataclass(frozen=True)
class Number:
    """A count on the dashboard and the list it came from (``url`` None: plain text)."""

    value: int
    url: str | None = None
    tone: str = ""  # "bad" draws attention to a non-zero number


@dataclass(frozen=True)
class WorkItemRow:
    label: str
    cells: list[Number]
    total: Number


@dataclass(frozen=True)
class CyclePanel:
    title: str
    cycle_url: str | None
    drop_session_id: str
    downloaded_at: dt.datetime
    due_date: dt.date
    days_left: int
    owed: int  # statuses DROP is still owed (none: the cycle waits for an amendment only)
    tone: str  # calm / soon / late
    timeline: SafeString
    rows: list[WorkItemRow]
    column_totals: list[Number]
    total: Number


@dataclass(frozen=True)
class IntegrationLine:
    name: str
    kind: str
    url: str | None
    enabled: bool
    disabled_reason: str
    last_success_at: dt.datetime | None
    failures_in_a_row: Number
    complete: bool  # False: no success among the latest attempts looked at


@dataclass(frozen=True)
class StuckLine:
    label: str
    work_items: Number
    nearest_due_date: dt.date | None


@dataclass(frozen=True)
class ObligationLine:
    failure_started_at: dt.datetime
    due_date: dt.date
    days_left: int
    ongoing: bool  # DROP still fails
    url: str | None  # its page, where staff record the notice

    @property
    def days_late(self) -> int:
        return -self.days_left


@dataclass(frozen=True)
class CanaryLine:
    """One target of a canary round: how its canaries answered."""

    round_label: str  # on the round's first line only
    result: str  # passed, failed, open: the round's
    tone: str  # calm, late, soon
    url: str | None
    target: str
    answers: str  # "TEST-1: deleted", or what went wrong


@dataclass(frozen=True)
class BrokerPanel:
    broker_id: str
    name: str
    mode: str
    url: str | None
    current: CyclePanel | None
    older_open: list[CyclePanel]
    attention: list[tuple[str, Number]]
    attention_total: int
    integrations: list[IntegrationLine]
    integrations_url: str | None
    last_download_at: dt.datetime | None
    last_download_url: str | None
    next_download_due: dt.date
    last_upload_at: dt.datetime | None
    last_upload_url: str | None
    outcomes_chart: SafeString
    failed_pull_at: dt.datetime | None = None  # the last pull failed: say so, and why
    failed_pull_error: str = ""
    failed_pull_url: str | None = None
    # The periodic stuck check (``drop doctor``): what no automatic path will move.
    stuck: list[StuckLine] = field(default_factory=list)
    stuck_since: dt.datetime | None = None
    # DROP outages of more than a day: the notice to CalPrivacy owed, until recorded.
    obligations: list[ObligationLine] = field(default_factory=list)
    # Directives to service providers awaiting acknowledgement (the overdue: "bad").
    directives: list[tuple[str, Number]] = field(default_factory=list)
    # Recurring deletion: the rounds' numbers; ``recurring_off`` says in red that the broker
    # owes it by other means.
    recurring: list[tuple[str, Number]] = field(default_factory=list)
    recurring_days: int = 0
    recurring_off: str = ""
    # When the worker counted them ("22:30 PST"); empty: counted for this page.
    recurring_counted_at: str = ""
    # The latest canary rounds, per target (none: the broker has no canary round yet).
    canaries: list[CanaryLine] = field(default_factory=list)
    canaries_url: str | None = None


@dataclass(frozen=True)
class Dashboard:
    today: dt.date
    brokers: list[BrokerPanel]
    outcomes: Sequence[Outcome] = OUTCOMES
    broker_outcomes: Sequence[BrokerOutcome] = BROKER_OUTCOMES
    open_cycles: int = 0
    nearest_due: CyclePanel | None = None
    nearest_due_broker: str = ""
    attention_total: int = 0
    integrations_failing: int = 0
    add_broker_url: str | None = None
    health_attempts: str = f"{HEALTH_ATTEMPTS:,}"
    private_targets_open: str = ""  # the warning while the outbound filter is open
    proxy_setting_missing: str = ""  # the warning while a proxy's clients all look like it


class _Links:
    """Admin URLs the current user may open; None where a list is missing or forbidden."""

    def __init__(self, request: HttpRequest) -> None:
        self.user = request.user

    def _allowed(self, model: str, action: str = "view") -> bool:
        if action == "view":
            return self.user.has_perm(f"integrations.view_{model}") or self.user.has_perm(
                f"integrations.change_{model}"
            )
        return self.user.has_perm(f"integrations.{action}_{model}")

    def changelist(self, model: str, **params: Any) -> str | None:
        if not self._allowed(model):
            return None
        try:
            url = reverse(f"admin:integrations_{model}_changelist")
        except NoReverseMatch:
            return None
        return f"{url}?{urlencode(params)}" if params else url

    def change(self, model: str, pk: int) -> str | None:
        if not self._allowed(model):
            return None
        try:
            return reverse(f"admin:integrations_{model}_change", args=[pk])
        except NoReverseMatch:
            return None

    def add(self, model: str) -> str | None:
        if not self._allowed(model, "add"):
            return None
        try:
            return reverse(f"admin:integrations_{model}_add")
        except NoReverseMatch:
            return None


def dashboard_context(request: HttpRequest) -> dict[str, Any]:
    now = timezone.now()
    today = drop_today(now)
    links = _Links(request)
    canaries = _canary_lines(links, now=now)
    panels = [
        _broker_panel(overview, links, now=now, today=today, canaries=canaries)
        for overview in dashboard_overview(now=now)
    ]
    open_panels = [
        (panel.name, cycle)
        for panel in panels
        for cycle in ([panel.current] if panel.current else []) + panel.older_open
    ]
    nearest = min(
        (pair for pair in open_panels if pair[1].owed),
        key=lambda pair: pair[1].days_left,
        default=None,
    )
    return {
        "dashboard": Dashboard(
            today=today,
            brokers=panels,
            open_cycles=len(open_panels),
            nearest_due=nearest[1] if nearest else None,
            nearest_due_broker=nearest[0] if nearest else "",
            attention_total=sum(panel.attention_total for panel in panels),
            integrations_failing=sum(
                1
                for panel in panels
                for line in panel.integrations
                if not line.enabled or line.failures_in_a_row.value
            ),
            add_broker_url=links.add("broker"),
            private_targets_open=(
                PRIVATE_TARGETS_OPEN if settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS else ""
            ),
            proxy_setting_missing=PROXY_SETTING_MISSING if proxy_setting_missing(request) else "",
        ),
        "ledger_anchor": ledger_anchor_status(),
    }


def _broker_panel(
    overview: BrokerOverview,
    links: _Links,
    *,
    now: dt.datetime,
    today: dt.date,
    canaries: dict[int, list[CanaryLine]],
) -> BrokerPanel:
    broker = overview.broker
    by_broker = {"broker__id__exact": broker.pk}
    last_cycle = overview.recent_cycles[-1].cycle if overview.recent_cycles else None
    return BrokerPanel(
        broker_id=broker.broker_id,
        name=broker.name,
        mode=broker.get_mode_display(),
        url=links.change("broker", broker.pk),
        current=_cycle_panel(overview.current_cycle, links, today=today)
        if overview.current_cycle
        else None,
        older_open=[_cycle_panel(c, links, today=today) for c in overview.open_cycles[1:]],
        attention=_attention_numbers(overview, links, now=now),
        attention_total=overview.attention.total,
        integrations=_integration_lines(overview, links),
        integrations_url=links.changelist("integration", **by_broker),
        last_download_at=overview.last_download_at,
        last_download_url=links.change("dropcycle", last_cycle.pk) if last_cycle else None,
        next_download_due=download_due_date(
            overview.last_download_at, overview.last_pulled_at, set_up=broker.created_at
        ),
        last_upload_at=overview.last_upload_at,
        last_upload_url=links.changelist("reportfile", **by_broker),
        failed_pull_at=overview.failed_pull.created_at if overview.failed_pull else None,
        failed_pull_error=str(overview.failed_pull.data.get("error", ""))
        if overview.failed_pull
        else "",
        failed_pull_url=links.changelist(
            "ledgerevent",
            kind__exact=LedgerKind.DROP_PULL_FAILED,
            broker_id__exact=broker.broker_id,
        ),
        stuck=_stuck_lines(overview, links),
        stuck_since=overview.doctor.created_at if overview.doctor else None,
        obligations=[
            ObligationLine(
                failure_started_at=obligation.failure_started_at,
                due_date=obligation.due_date,
                days_left=(obligation.due_date - today).days,
                ongoing=obligation.outage.ended_at is None,
                url=links.change("dropaccessobligation", obligation.pk),
            )
            for obligation in overview.drop_access_obligations
        ],
        directives=_directive_numbers(overview, links, now=now),
        recurring=_recurring_numbers(overview, links),
        recurring_days=settings.DROPPORTAL_RECURRING_DAYS,
        recurring_off=RECURRING_OFF if settings.DROPPORTAL_RECURRING_DAYS <= 0 else "",
        recurring_counted_at=drop_clock_text(overview.recurring.counted_at)
        if overview.recurring and overview.recurring.counted_at
        else "",
        canaries=canaries.get(broker.pk, []),
        canaries_url=links.changelist("canaryround", broker__id__exact=broker.pk),
        outcomes_chart=charts.stacked_bars(
            [_outcome_bar(c, links) for c in overview.recent_cycles],
            title=f"The broker's outcomes per cycle, broker {broker.broker_id}",
            width=440,
            height=190,
        ),
    )


# How many of a broker's latest canary rounds the dashboard shows.
DASHBOARD_CANARY_ROUNDS = 3
_CANARY_TONES = {PASSED: "calm", FAILED: "late", OPEN: "soon"}


def _canary_lines(links: _Links, *, now: dt.datetime) -> dict[int, list[CanaryLine]]:
    """Every broker's latest canary rounds, newest first, one line per target, by broker pk
    (two queries, whatever the number of brokers)."""
    latest = CanaryRound.objects.annotate(
        newest=Window(RowNumber(), partition_by=F("broker_id"), order_by=F("started_at").desc())
    ).filter(newest__lte=DASHBOARD_CANARY_ROUNDS)
    rounds = latest.select_related("cycle").order_by("broker_id", "-started_at", "-pk")
    lines: dict[int, list[CanaryLine]] = {}
    for result in canary_round_results(rounds=rounds, now=now):
        canary_round = result.canary_round
        label = f"{drop_time_text(canary_round.started_at)}" + (
            f" (cycle {canary_round.cycle.drop_session_id})" if canary_round.cycle else ""
        )
        by_target = {
            target: ", ".join(
                f"{a.remote_identifier}: {a.drop_outcome or a.state}"
                + (f" ({a.why})" if a.why else "")
                for a in answers
            )
            for target, answers in result.by_target().items()
        } or {"no target": "; ".join(result.problems)}
        for n, (target, answers) in enumerate(by_target.items()):
            lines.setdefault(canary_round.broker_id, []).append(
                CanaryLine(
                    round_label=label if n == 0 else "",
                    result=result.result,
                    tone=_CANARY_TONES[result.result],
                    url=links.change("canaryround", canary_round.pk) if n == 0 else None,
                    target=target,
                    answers=answers,
                )
            )
    return lines


def _directive_numbers(
    overview: BrokerOverview, links: _Links, *, now: dt.datetime
) -> list[tuple[str, Number]]:
    """Directives not acknowledged yet, and those past DROPPORTAL_DIRECTIVE_ACK_DAYS."""
    if not overview.directives_awaiting:
        return []
    unacknowledged = {"broker__id__exact": overview.broker.pk, "acknowledged_at__isempty": "1"}
    return [
        (
            "awaiting acknowledgement",
            Number(overview.directives_awaiting, links.changelist("directive", **unacknowledged)),
        ),
        (
            f"not acknowledged within {settings.DROPPORTAL_DIRECTIVE_ACK_DAYS} days",
            Number(
                overview.directives_overdue,
                links.changelist("directive", **unacknowledged),
                tone="bad",
            ),
        ),
    ]


# Shown in red while DROPPORTAL_RECURRING_DAYS is 0.
RECURRING_OFF = (
    "Recurring deletion is off (DROPPORTAL_RECURRING_DAYS=0): the broker owes every deleted "
    "or opted-out consumer's deletion again at least every 45 days by other means "
    "(Civil Code 1798.99.86(d))."
)


def _recurring_numbers(overview: BrokerOverview, links: _Links) -> list[tuple[str, Number]]:
    """The broker's recurring deletion rounds (counts of work items), linked to the
    requests of the rounds where there are some."""
    rounds = overview.recurring
    if rounds is None or rounds.off:
        return []
    by_broker = {"broker__id__exact": overview.broker.pk, "round__gte": 1}
    return [
        ("due, not sent yet", Number(rounds.due)),
        (
            "sent, awaiting the answer",
            Number(
                rounds.sent,
                links.changelist(
                    "deletionrequest", **by_broker, state__in="queued,dispatched,pending"
                ),
            ),
        ),
        (
            "answered",
            Number(
                rounds.answered,
                links.changelist("deletionrequest", **by_broker, state__exact="completed"),
            ),
        ),
        (
            "failing",
            Number(
                rounds.failing,
                links.changelist("deletionrequest", **by_broker, state__in="failed,undeliverable"),
                "bad",
            ),
        ),
        (
            f"overdue by more than {RECURRING_OVERDUE_DAYS} days",
            Number(rounds.overdue, None, "bad"),
        ),
    ]


def _attention_numbers(
    overview: BrokerOverview, links: _Links, *, now: dt.datetime
) -> list[tuple[str, Number]]:
    """The broker's requests needing attention, each count linked to its list."""
    by_broker = {"broker__id__exact": overview.broker.pk}
    attention = overview.attention
    stale_before = (now - AWAITING_CALLBACK_ATTENTION).isoformat()
    return [
        (
            "failed",
            Number(
                attention.failed,
                links.changelist("deletionrequest", **by_broker, state__exact="failed"),
                "bad",
            ),
        ),
        (
            "undeliverable",
            Number(
                attention.undeliverable,
                links.changelist("deletionrequest", **by_broker, state__exact="undeliverable"),
                "bad",
            ),
        ),
        (
            "awaiting a callback for more than 7 days",
            Number(
                attention.awaiting_callback,
                links.changelist(
                    "deletionrequest",
                    **by_broker,
                    state__exact="dispatched",
                    dispatched_at__lt=stale_before,
                ),
                "bad",
            ),
        ),
    ]


def _integration_lines(overview: BrokerOverview, links: _Links) -> list[IntegrationLine]:
    """The broker's integrations and how their deliveries go, each linked to its page."""
    return [
        IntegrationLine(
            name=health.integration.name,
            kind=health.integration.get_kind_display(),
            url=links.change("integration", health.integration.pk),
            enabled=health.integration.enabled,
            disabled_reason=health.integration.disabled_reason,
            last_success_at=health.last_success_at,
            # Attempts are shown on their requests' pages; the integration's own page
            # shows what waits for it.
            failures_in_a_row=Number(
                health.failures_in_a_row,
                links.change("integration", health.integration.pk),
                "bad",
            ),
            complete=health.complete,
        )
        for health in overview.integrations
    ]


def _stuck_lines(overview: BrokerOverview, links: _Links) -> list[StuckLine]:
    """The groups of the periodic stuck check's last result, each linked to its list."""
    if overview.doctor is None:
        return []
    lines = []
    for group in overview.doctor.data.get("groups", []):
        path = str(group.get("admin_path", ""))
        model = path.rstrip("/").split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        allowed = links.changelist(model) is not None
        due = group.get("nearest_due_date")
        lines.append(
            StuckLine(
                label=str(group.get("label", group.get("reason", ""))),
                work_items=Number(
                    int(group.get("work_items", 0)), path if allowed else None, "bad"
                ),
                nearest_due_date=dt.date.fromisoformat(due) if due else None,
            )
        )
    return lines


def _cycle_panel(cycle_items: CycleWorkItems, links: _Links, *, today: dt.date) -> CyclePanel:
    cycle = cycle_items.cycle
    days_left = (cycle.due_date - today).days
    by_cycle = {"cycle__id__exact": cycle.pk}
    columns = [outcome.code for outcome in OUTCOMES]

    def status_params(code: int | None) -> dict[str, Any]:
        return {"status_code__exact": code} if code is not None else {"status_code__isnull": 1}

    def items(**params: Any) -> str | None:
        return links.changelist("workitem", **by_cycle, **params)

    rows = []
    for state, label in WorkItemState.choices:
        counts = [cycle_items.counts.get((state, code), 0) for code in columns]
        if not any(counts):
            continue
        rows.append(
            WorkItemRow(
                label=label.split(" (")[0],  # "Removed (consumer cancelled)": "Removed"
                cells=[
                    Number(n, items(state__exact=state, **status_params(code)) if n else None)
                    for n, code in zip(counts, columns, strict=True)
                ],
                total=Number(sum(counts), items(state__exact=state)),
            )
        )
    column_totals = []
    for code in columns:
        n = sum(v for (state, c), v in cycle_items.counts.items() if c == code)
        column_totals.append(Number(n, items(**status_params(code)) if n else None))
    return CyclePanel(
        title=f"Cycle {cycle.drop_session_id}",
        cycle_url=links.change("dropcycle", cycle.pk),
        drop_session_id=cycle.drop_session_id,
        downloaded_at=cycle.downloaded_at,
        due_date=cycle.due_date,
        days_left=days_left,
        owed=cycle_items.owed,
        tone=charts.days_left_tone(days_left, owed=cycle_items.owed),
        timeline=charts.cycle_timeline(
            start=drop_date(cycle.downloaded_at),
            due=cycle.due_date,
            today=today,
            not_removed=cycle_items.not_removed,
            with_status=cycle_items.with_status,
            reported=cycle_items.reported,
            owed=cycle_items.owed,
            title=f"Cycle {cycle.drop_session_id}: {cycle.due_date:%Y-%m-%d} deadline",
        ),
        rows=rows,
        column_totals=column_totals,
        total=Number(cycle_items.total, items()),
    )


def _outcome_bar(cycle_items: CycleWorkItems, links: _Links) -> charts.Bar:
    """One cycle's deletion requests by the broker's outcome (matches only: most work items
    of a DROP list match no consumer and would flatten every other outcome; the match's own,
    round 0, not the recurring rounds')."""
    cycle = cycle_items.cycle

    def url(outcome: BrokerOutcome) -> str | None:
        params: dict[str, Any] = {"drop_outcome__exact": outcome.value, "round__exact": 0}
        if not outcome.value:
            params["state__in"] = UNCANCELLED
        # The request admin filters by cycle with its own "cycle" parameter.
        return links.changelist("deletionrequest", cycle=cycle.pk, **params)

    # The day DROP dates the download by, not UTC's (a download at 22:30 Pacific is the
    # next day in UTC).
    downloaded_on = drop_date(cycle.downloaded_at)
    return charts.Bar(
        label=f"#{cycle.drop_session_id}",
        sublabel=f"{downloaded_on:%b} {downloaded_on.day}",
        url=links.change("dropcycle", cycle.pk),
        segments=[
            charts.Segment(o.label, cycle_items.request_outcomes.get(o.value, 0), o.color, url(o))
            for o in BROKER_OUTCOMES
        ],
    )
