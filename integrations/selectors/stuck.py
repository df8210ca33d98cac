"""Stuck work items (``drop doctor``): open items with no live path to a status."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.db.models import Count, F, Min, Q, QuerySet, Value
from django.utils import timezone

from integrations.dispatch.policy import AUTO_REDISPATCH_MAX
from integrations.drop.calendar import drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    DropCycle,
    ReportFile,
    ReportFileState,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    UnreadableWorkItem,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.pulls import brokers_with_drop_key_refused
from integrations.selectors.recurring import (
    RECURRING_OVERDUE_DAYS,
    StuckCounts,
    recurring_stuck_counts,
)
from integrations.selectors.requests import AWAITING_CALLBACK_ATTENTION, automatic_redispatches


class StuckReason(enum.StrEnum):
    """Why a work item has no live path to a status: nothing automatic will move it."""

    PENDING_WITHOUT_TARGET = "pending_without_target"
    FAILED_WAITING_FOR_STAFF = "failed_waiting_for_staff"
    UNDELIVERABLE = "undeliverable"
    NO_CALLBACK = "no_callback"
    RESOLUTION_STUCK = "resolution_stuck"
    TARGET_DISABLED = "target_disabled"
    DROP_KEY_REFUSED = "drop_key_refused"
    UNREADABLE_WORK_ITEM = "unreadable_work_item"
    REPORT_FILE_REFUSED = "report_file_refused"
    REPORT_FILE_AWAITING_APPROVAL = "report_file_awaiting_approval"
    RECURRING_ROUND_OVERDUE = "recurring_round_overdue"
    RECURRING_ROUND_FAILING = "recurring_round_failing"
    RECURRING_ROUND_BLOCKED = "recurring_round_blocked"

    @property
    def label(self) -> str:
        return STUCK_REASON_LABELS[self]


STUCK_REASON_LABELS: dict[StuckReason, str] = {
    StuckReason.PENDING_WITHOUT_TARGET: "pending without a target",
    StuckReason.FAILED_WAITING_FOR_STAFF: "failed, waiting for staff to redispatch",
    StuckReason.UNDELIVERABLE: "undeliverable",
    StuckReason.NO_CALLBACK: "dispatched, no callback for more than 7 days",
    StuckReason.RESOLUTION_STUCK: "identifier retrieval or SaaS deletion stuck",
    StuckReason.TARGET_DISABLED: "waiting for a disabled target",
    StuckReason.DROP_KEY_REFUSED: "DROP refused the broker's key",
    StuckReason.UNREADABLE_WORK_ITEM: "sent by DROP but unreadable: answer them in DROP's portal",
    StuckReason.REPORT_FILE_REFUSED: "in a response file DROP refused or rejected",
    StuckReason.REPORT_FILE_AWAITING_APPROVAL: (
        "in a response file waiting for approval by a second person"
    ),
    StuckReason.RECURRING_ROUND_OVERDUE: (
        f"recurring deletion round more than {RECURRING_OVERDUE_DAYS} days overdue"
    ),
    StuckReason.RECURRING_ROUND_FAILING: "recurring deletion round failed or undeliverable",
    StuckReason.RECURRING_ROUND_BLOCKED: (
        "status set by staff over the match's open requests: no recurring deletion round"
        " starts until they have a final answer"
    ),
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
    targets: tuple[str, ...] = ()  # the targets they wait for, named (target_disabled)

    @property
    def label(self) -> str:
        if self.targets:
            return f"{self.reason.label}: {', '.join(self.targets)}"
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
            "targets": list(self.targets),
        }


def _admin_path(model: str, **params: Any) -> str:
    from django.urls import reverse
    from django.utils.http import urlencode

    return f"{reverse(f'admin:integrations_{model}_changelist')}?{urlencode(params)}"


def _counts_query(rows: QuerySet[Any], *, item: str, broker: str, due: str) -> QuerySet[Any]:
    return rows.values(b=F(f"{broker}__broker_id"), bpk=F(broker)).annotate(
        items=Count(item, distinct=True), n=Count("pk"), due=Min(due)
    )


# What a part of the stuck check's one statement is known by.
_Key = TypeVar("_Key", bound=Hashable)

# Rows of open work items, with how ``_counts_query`` counts them: per broker, (broker_id,
# broker pk, work items, rows, nearest due date).
_Rows = tuple[QuerySet[Any], dict[str, str]]


def _stuck_counts_each(parts: dict[_Key, _Rows]) -> dict[_Key, StuckCounts]:
    """The counts of each of ``parts``, by the same key, read in one statement (their
    UNION ALL, each part the query it would be alone, so its plan is too): the stuck check
    runs every few minutes (alerts, ``/metrics``), one round trip rather than one per reason
    and kind."""
    counts: dict[_Key, StuckCounts] = {key: [] for key in parts}
    if not parts:
        return counts
    # Each row names its part by the part's place among the keys, read back from the same.
    keys = list(parts)
    queries = [
        _counts_query(rows, **fields).annotate(part=Value(index)).order_by()
        for index, (rows, fields) in enumerate(parts[key] for key in keys)
    ]
    for row in queries[0].union(*queries[1:], all=True):
        counts[keys[row["part"]]].append((row["b"], row["bpk"], row["items"], row["n"], row["due"]))
    return counts


def stuck_work_items(
    *,
    broker: Broker | None = None,
    now: dt.datetime | None = None,
    reasons: Collection[StuckReason] | None = None,
) -> list[StuckGroup]:
    """Every open work item (matched, status still owed) that has no live path to a status,
    grouped by broker and reason, nearest due date first.

    An item is stuck when one of its requests (or SaaS deletions) will not move without
    staff: its status needs them all. An item held for two reasons is in both groups.
    Removed items owe nothing and are never listed. Reads a few aggregate queries; no row
    is loaded. ``reasons``: only the groups of these (each reason's are the same either way),
    and only their queries; every reason by default.
    """
    now = now or timezone.now()
    wanted = set(StuckReason) if reasons is None else set(reasons)
    found: dict[tuple[str, StuckReason], StuckGroup] = {}
    sources = [
        source
        for source in _stuck_sources(broker=broker, stale=now - AWAITING_CALLBACK_ATTENTION)
        if source[0] in wanted
    ]
    paused = _paused_target_rows(broker) if StuckReason.TARGET_DISABLED in wanted else []
    unreadable = _unreadable_rows(broker) if StuckReason.UNREADABLE_WORK_ITEM in wanted else None
    # Each part keyed by its reason and its place in that reason's own list.
    parts: dict[tuple[StuckReason, int], _Rows] = {
        (reason, index): part
        for reason, _, _, reason_parts in sources
        for index, part in enumerate(reason_parts)
    }
    parts.update(
        ((StuckReason.TARGET_DISABLED, index), target.rows) for index, target in enumerate(paused)
    )
    if unreadable is not None:
        parts[(StuckReason.UNREADABLE_WORK_ITEM, 0)] = unreadable
    refused = _drop_key_refused_rows(broker) if StuckReason.DROP_KEY_REFUSED in wanted else None
    if refused is not None:
        parts[(StuckReason.DROP_KEY_REFUSED, 0)] = refused
    file_reasons = [r for r in _REPORT_FILE_STATES if r in wanted]
    if file_reasons:
        held = _report_files_held(broker, [s for r in file_reasons for s in _REPORT_FILE_STATES[r]])
        for reason in file_reasons:
            # A reason with no file is an empty part (an empty IN): the UNION leaves it out.
            parts[(reason, 0)] = _report_file_rows(
                [f for f in held if f[0] in _REPORT_FILE_STATES[reason]]
            )
    counts = _stuck_counts_each(parts)
    for reason, model, params, reason_parts in sources:
        for index in range(len(reason_parts)):
            _add_stuck_group(found, reason, model, params, counts[(reason, index)])
    if paused:
        _add_disabled_target_groups(
            found,
            [
                (target, counts[(StuckReason.TARGET_DISABLED, index)])
                for index, target in enumerate(paused)
            ],
        )
    if refused is not None:
        _add_stuck_group(
            found,
            StuckReason.DROP_KEY_REFUSED,
            "ledgerevent",
            {"kind__exact": LedgerKind.DROP_PULL_FAILED},
            counts[(StuckReason.DROP_KEY_REFUSED, 0)],
        )
    if unreadable is not None:
        # No request holds them: nothing was sent for them.
        _add_stuck_group(
            found,
            StuckReason.UNREADABLE_WORK_ITEM,
            "unreadableworkitem",
            {},
            [
                (broker_id, pk, items, 0, due)
                for broker_id, pk, items, _, due in counts[(StuckReason.UNREADABLE_WORK_ITEM, 0)]
            ],
        )
    for reason in file_reasons:
        _add_stuck_group(
            found,
            reason,
            "reportfile",
            _state_filter(_REPORT_FILE_STATES[reason]),
            counts[(reason, 0)],
        )
    # Not open items: DROP holds their status, but the broker owes their deletion again
    # (its nearest due date is the round's).
    recurring = {
        StuckReason.RECURRING_ROUND_OVERDUE,
        StuckReason.RECURRING_ROUND_FAILING,
        StuckReason.RECURRING_ROUND_BLOCKED,
    }
    if recurring & wanted:
        overdue, failing, blocked = recurring_stuck_counts(broker=broker, today=drop_today(now))
        if StuckReason.RECURRING_ROUND_OVERDUE in wanted:
            _add_stuck_group(
                found,
                StuckReason.RECURRING_ROUND_OVERDUE,
                "deletionrequest",
                {"round__gte": 1},
                overdue,
            )
        if StuckReason.RECURRING_ROUND_FAILING in wanted:
            _add_stuck_group(
                found,
                StuckReason.RECURRING_ROUND_FAILING,
                "deletionrequest",
                {
                    "round__gte": 1,
                    **_state_filter([RequestState.FAILED, RequestState.UNDELIVERABLE]),
                },
                failing,
            )
        if StuckReason.RECURRING_ROUND_BLOCKED in wanted:
            # The match's own requests that are still open: those to bring to an answer.
            _add_stuck_group(
                found,
                StuckReason.RECURRING_ROUND_BLOCKED,
                "deletionrequest",
                {"round": "0", **_state_filter(_OPEN_STATES)},
                blocked,
            )
    order = list(StuckReason)
    return sorted(
        found.values(),
        key=lambda g: (g.broker_id, g.nearest_due_date, order.index(g.reason)),
    )


# Where each kind of row holding work items finds its work item, broker and due date
# (``_counts_query``'s keywords).
_WORK_ITEM_ROWS = {"item": "pk", "broker": "broker", "due": "cycle__due_date"}
_DELETION_ROWS = {"item": "work_item", "broker": "broker", "due": "work_item__cycle__due_date"}
_RESOLUTION_ROWS = _DELETION_ROWS
_SAAS_ROWS = {
    "item": "resolution__work_item",
    "broker": "resolution__broker",
    "due": "resolution__work_item__cycle__due_date",
}

# A reason, the admin list of what holds the items (model, filters), and the rows holding
# them with how to count them.
_StuckSource = tuple[StuckReason, str, dict[str, Any], list[_Rows]]


def _stuck_sources(*, broker: Broker | None, stale: dt.datetime) -> list[_StuckSource]:
    """For each reason but a refused DROP key: the rows that hold open work items for it
    (dispatched before ``stale`` is waiting too long for a callback)."""
    deletions, resolutions, saas = _open_item_rows(broker)
    failed = _failed_waiting_for_staff(deletions)
    failed_or_no_callback = Q(state=RequestState.FAILED) | Q(
        state=RequestState.DISPATCHED, dispatched_at__lt=stale
    )
    return [
        (
            StuckReason.PENDING_WITHOUT_TARGET,
            "deletionrequest",
            _state_filter([RequestState.PENDING]),
            [(deletions.filter(state=RequestState.PENDING), _DELETION_ROWS)],
        ),
        (
            StuckReason.FAILED_WAITING_FOR_STAFF,
            "deletionrequest",
            _state_filter([RequestState.FAILED]),
            [(failed, _DELETION_ROWS)],
        ),
        (
            StuckReason.UNDELIVERABLE,
            "deletionrequest",
            _state_filter([RequestState.UNDELIVERABLE]),
            [
                (deletions.filter(state=RequestState.UNDELIVERABLE), _DELETION_ROWS),
                (resolutions.filter(state=RequestState.UNDELIVERABLE), _RESOLUTION_ROWS),
                (saas.filter(state=RequestState.UNDELIVERABLE), _SAAS_ROWS),
            ],
        ),
        (
            StuckReason.NO_CALLBACK,
            "deletionrequest",
            {**_state_filter([RequestState.DISPATCHED]), "dispatched_at__lt": stale.isoformat()},
            [
                (
                    deletions.filter(state=RequestState.DISPATCHED, dispatched_at__lt=stale),
                    _DELETION_ROWS,
                )
            ],
        ),
        (
            StuckReason.RESOLUTION_STUCK,
            "resolutionrequest",
            {},
            [
                (resolutions.filter(failed_or_no_callback), _RESOLUTION_ROWS),
                (
                    saas.filter(failed_or_no_callback, saas_connection__enabled=True),
                    _SAAS_ROWS,
                ),
            ],
        ),
    ]


# A request's states with no final answer yet.
_OPEN_STATES = [
    RequestState.PENDING,
    RequestState.QUEUED,
    RequestState.DISPATCHED,
    RequestState.FAILED,
    RequestState.UNDELIVERABLE,
]


# What waits for a paused target: not yet sent, or sent and not answered (a disabled
# integration's callbacks are taken, but nothing is sent to it again until it is enabled).
_WAITING_FOR_TARGET = [RequestState.QUEUED, RequestState.FAILED, RequestState.DISPATCHED]


class _PausedTarget(NamedTuple):
    """Rows waiting for a kind of paused target, and how to list and name their targets."""

    rows: _Rows
    model: str  # the admin list of the targets
    kind: str  # the targets' kind, as a group names them
    names: tuple[str, str, str]  # each row's broker id, target name and target key


def _paused_target_rows(broker: Broker | None) -> list[_PausedTarget]:
    """``target_disabled``'s rows: open work items' requests that wait for a disabled
    integration or SaaS connection (paused by staff or by a 410), each with the admin list of
    its targets."""
    deletions, resolutions, saas = _open_item_rows(broker)
    paused = {"state__in": _WAITING_FOR_TARGET, "integration__enabled": False}
    integration_names = ("broker__broker_id", "integration__name", "integration__uuid")
    return [
        _PausedTarget(
            (deletions.filter(**paused), _DELETION_ROWS),
            "integration",
            "integration",
            integration_names,
        ),
        _PausedTarget(
            (resolutions.filter(**paused), _RESOLUTION_ROWS),
            "integration",
            "integration",
            integration_names,
        ),
        _PausedTarget(
            (
                saas.filter(state__in=_WAITING_FOR_TARGET, saas_connection__enabled=False),
                _SAAS_ROWS,
            ),
            "saasconnection",
            "SaaS connection",
            ("resolution__broker__broker_id", "saas_connection__name", "saas_connection__uuid"),
        ),
    ]


def _add_disabled_target_groups(
    found: dict[tuple[str, StuckReason], StuckGroup],
    paused: list[tuple[_PausedTarget, StuckCounts]],
) -> None:
    """Add ``target_disabled``'s groups (``_paused_target_rows`` and their counts), each
    naming the targets its items wait for."""
    reason = StuckReason.TARGET_DISABLED
    names: dict[str, set[str]] = {}
    for target, counts in paused:
        _add_stuck_group(found, reason, target.model, {"enabled__exact": 0}, counts)
        if not counts:
            continue  # no row waits for a paused target: no name to read
        rows, _ = target.rows
        kind = target.kind
        for broker_id, name, key in rows.values_list(*target.names).distinct():
            names.setdefault(broker_id, set()).add(f"{kind} {name!r} ({key})")
    for broker_id, targets in names.items():
        group = found[(broker_id, reason)]
        found[(broker_id, reason)] = dataclasses.replace(group, targets=tuple(sorted(targets)))


def _open_item_rows(
    broker: Broker | None,
) -> tuple[QuerySet[DeletionRequest], QuerySet[ResolutionRequest], QuerySet[SaasDeletion]]:
    """The deletion requests, resolution requests and SaaS deletions of open work items (of
    ``broker`` if given), and the match's own (round 0) of reported ones: a consumer matched
    later or come back is asked while the item keeps the status DROP holds, and its request
    can wait for staff all the same."""
    open_item = Q(work_item__state=WorkItemState.OPEN) | Q(
        work_item__state=WorkItemState.REPORTED, round=0
    )
    deletions = DeletionRequest.objects.filter(open_item)
    resolutions = ResolutionRequest.objects.filter(open_item)
    saas = SaasDeletion.objects.filter(
        Q(resolution__work_item__state=WorkItemState.OPEN)
        | Q(resolution__work_item__state=WorkItemState.REPORTED, resolution__round=0)
    )
    if broker is not None:
        deletions = deletions.filter(broker=broker)
        resolutions = resolutions.filter(broker=broker)
        saas = saas.filter(resolution__broker=broker)
    return deletions, resolutions, saas


def _failed_waiting_for_staff(
    deletions: QuerySet[DeletionRequest],
) -> QuerySet[DeletionRequest]:
    """Failed requests to an enabled integration that nothing automatic will send again."""
    failed = deletions.filter(state=RequestState.FAILED, integration__enabled=True)
    if settings.DROPPORTAL_AUTO_REDISPATCH_HOURS > 0:
        # The automatic policy sends a failure again, up to AUTO_REDISPATCH_MAX times.
        failed = failed.annotate(automatic=automatic_redispatches()).filter(
            automatic__gte=AUTO_REDISPATCH_MAX
        )
    return failed


def _drop_key_refused_rows(broker: Broker | None) -> _Rows | None:
    """The open and reportable work items of brokers whose DROP key was refused (no status
    reaches DROP until staff change it); None, the usual case, when no key is refused."""
    # The brokers are read first: their test is per broker (the ledger's last word), and
    # the items' part then filters on their keys alone.
    refused = list(
        brokers_with_drop_key_refused(
            Broker.objects.filter(pk=broker.pk) if broker is not None else None
        ).values_list("pk", flat=True)
    )
    if not refused:
        return None
    items = WorkItem.objects.outstanding().filter(
        cycle__in=DropCycle.objects.may_have_outstanding(), broker_id__in=refused
    )
    return (items, _WORK_ITEM_ROWS)


def _unreadable_rows(broker: Broker | None) -> _Rows:
    """The unreadable rows of each broker's latest cycle. Nothing of ours can give them a
    status; once DROP sends a later package it holds the earlier one answered (it sends none
    while a work item of it has no status), so older ones are done."""
    # Every row of the latest package, those that owe no status of their own included (one
    # of the Removed file may name a withdrawn identifier still being acted on).
    rows = UnreadableWorkItem.objects.latest_package()
    if broker is not None:
        rows = rows.filter(broker=broker)
    return (rows, _WORK_ITEM_ROWS)


# The response files that hold work items for a reason (``pending_report_file``): a file
# DROP refused (sent again each run, in vain until DROP's state changes or staff discard the
# amendment) or rejected (the periodic job leaves its rows to staff), and one waiting for
# approval (the broker's "approve uploads": nothing sends it until a second person does).
_REPORT_FILE_STATES: dict[StuckReason, list[ReportFileState]] = {
    StuckReason.REPORT_FILE_REFUSED: [ReportFileState.REFUSED, ReportFileState.REJECTED],
    StuckReason.REPORT_FILE_AWAITING_APPROVAL: [ReportFileState.AWAITING_APPROVAL],
}


def _state_filter(states: Sequence[str]) -> dict[str, str]:
    """The admin list's filter for rows in one of ``states``."""
    if len(states) == 1:
        return {"state__exact": states[0]}
    return {"state__in": ",".join(states)}


def _report_files_held(
    broker: Broker | None, states: list[ReportFileState]
) -> list[tuple[str, int, int]]:
    """(state, pk, cycle) of the response files in one of ``states``, in one query."""
    files = ReportFile.objects.all() if broker is None else ReportFile.objects.filter(broker=broker)
    return list(files.filter(state__in=states).values_list("state", "pk", "cycle_id"))


def _report_file_rows(held: list[tuple[str, int, int]]) -> _Rows:
    """The work items still with one of the ``held`` response files (``_report_files_held``)
    as their ``pending_report_file``."""
    # A rejected file stays rejected once its rows went out again: naming the files' cycles
    # reads those cycles' rows (the (cycle, work item id) index), not every work item.
    items = WorkItem.objects.filter(
        cycle_id__in={cycle for _, _, cycle in held},
        pending_report_file_id__in=[pk for _, pk, _ in held],
    ).exclude(state=WorkItemState.REMOVED)
    return (items, _WORK_ITEM_ROWS)


def _add_stuck_group(
    found: dict[tuple[str, StuckReason], StuckGroup],
    reason: StuckReason,
    model: str,
    params: dict[str, Any],
    counts: StuckCounts,
) -> None:
    """Add ``counts`` (one part's, ``_stuck_counts_each``) to the groups ``found`` for
    ``reason``."""
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
