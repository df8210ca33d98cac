"""The actioning component: what the broker's deletion targets were asked and answered in the
period, and the canary rounds that tested them, observed rather than attested.

    component = build(context)   # records: requests per target, recurring rounds, canaries

Its tests: every canary round of the period passed (each canary's request to each target
answered ``deleted`` within ``DROPPORTAL_CANARY_HOURS``), and at least one did.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, QuerySet

from integrations.models import CanaryRound, DropCycle
from integrations.selectors.canaries import FAILED, OPEN, PASSED, canary_round_results
from integrations.services.evidence.components.base import Component, PackContext

KEY = "actioning"
NO_CANARY = "no canary tested the deletion system in this period"

PROVES = (
    "Which deletion targets (webhook integrations, ISI connections) the period's DROP "
    "matches were sent to and what each answered, the recurring deletion rounds and their "
    "answers, and the canary rounds: a test consumer the broker keeps in its systems, sent a "
    "deletion to every target each cycle (drop_session_id 0, never reported to DROP), whose "
    "answer is recorded as the broker's signed callback gave it. A round passes only when "
    "every target answered deleted in time."
)
CANNOT_PROVE = (
    "That the broker's systems deleted what they answered deleted: the pack holds the "
    "answers, not the broker's databases. A canary shows the deletion path works for a test "
    "record on the day of the round; it does not show every other consumer was handled the "
    "same way, nor that the broker's tooling put the canary back, nor what happened at "
    "systems the service does not send to."
)


def _target(row: dict[str, Any]) -> str:
    name = row["integration__name"] or "no target yet"
    if row["isi_connection__uuid"] is not None:
        return f"{name} / {row['isi_connection__uuid']}"
    return name


def _by_target(requests: QuerySet[Any]) -> dict[str, dict[str, int]]:
    """Per target: the requests by outcome (``no outcome yet``: by their state)."""
    rows = (
        requests.values("integration__name", "isi_connection__uuid", "drop_outcome", "state")
        .annotate(n=Count("pk"))
        .order_by("integration__name", "isi_connection__uuid", "drop_outcome", "state")
    )
    table: dict[str, dict[str, int]] = {}
    for row in rows:
        answer = row["drop_outcome"] or f"no outcome yet ({row['state']})"
        counts = table.setdefault(_target(row), {})
        counts[answer] = counts.get(answer, 0) + row["n"]
    return table


def _rounds(context: PackContext) -> QuerySet[CanaryRound]:
    """The period's canary rounds: for a cycle, those its import ran and those run by hand
    until the next cycle came; for a period, those started in it."""
    period = context.period
    rounds = CanaryRound.objects.filter(broker=context.broker).select_related("cycle")
    if period.cycle is None:
        return rounds.filter(started_at__gte=period.since, started_at__lt=period.until)
    later = (
        DropCycle.objects.filter(
            broker=context.broker, downloaded_at__gt=period.cycle.downloaded_at
        )
        .order_by("downloaded_at")
        .values_list("downloaded_at", flat=True)
        .first()
    )
    by_hand = Q(cycle__isnull=True, started_at__gte=period.cycle.downloaded_at)
    if later is not None:
        by_hand &= Q(started_at__lt=later)
    return rounds.filter(Q(cycle=period.cycle) | by_hand)


def build(context: PackContext) -> Component:
    component = Component(key=KEY, proves=PROVES, cannot_prove=CANNOT_PROVE)
    requests = context.period.requests()
    component.records["deletion_requests_by_target"] = _by_target(requests.filter(round=0))
    recurring = requests.filter(round__gt=0)
    component.records["recurring_rounds"] = {
        "rounds": recurring.values("work_item_id", "round").distinct().count(),
        "by_target": _by_target(recurring),
    }
    results = canary_round_results(
        rounds=_rounds(context).order_by("started_at", "pk"), now=context.exported_at
    )
    component.records["canary_rounds"] = [result.as_json() for result in results]

    failed = [result for result in results if result.result == FAILED]
    still_open = [result for result in results if result.result == OPEN]
    passed = [result for result in results if result.result == PASSED]
    waiting = (
        f"; {len(still_open)} round(s) still within their hours, not judged yet"
        if still_open
        else ""
    )
    component.test(
        "every canary round of the period passed (each target answered deleted in time)",
        passed=not failed,
        detail="; ".join(
            f"round {result.canary_round.pk}: {', '.join(result.problems)}" for result in failed
        )
        + waiting
        if failed
        else f"{len(passed)} of {len(results)} round(s) passed{waiting}",
    )
    component.test(
        "at least one canary round ran in the period",
        passed=bool(passed),
        detail=f"{len(passed)} round(s) passed"
        if passed
        else NO_CANARY + (f" ({len(results)} round(s) ran, none passed)" if results else ""),
    )
    return component
