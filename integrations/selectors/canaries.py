"""How each canary round went, per target: the deletion system tested, observed.

A round passes when every canary's request to every target was answered ``deleted`` by the
round's ``answer_by`` (``DROPPORTAL_CANARY_HOURS`` after it started). It fails at once on
any other answer (``failed``, ``not_found``, ``opted_out``, ``exempt``), an undeliverable or
cancelled request, a canary no longer registered, no target at all, or a request of the
round no longer recorded; and once ``answer_by`` has passed with a request still unanswered.
Until then it is open::

    results = canary_round_results(rounds=CanaryRound.objects.filter(broker=broker), now=now)
    results[0].result        # "passed" | "failed" | "open"
    results[0].by_target()   # per target: the canaries' answers
    canary_rounds_failing(now=now)   # what the canary_failed alert names
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from integrations.models import CanaryRound, DeletionRequest, DropOutcome, RequestState

PASSED, FAILED, OPEN = "passed", "failed", "open"


@dataclass(frozen=True)
class CanaryAnswer:
    """One canary's request to one target, and what it came to."""

    remote_identifier: str
    target: str  # the integration's name, and the ISI connection's UUID for an ISI target
    request_uuid: str
    state: str
    drop_outcome: str
    completed_at: dt.datetime | None
    error_message: str
    result: str  # passed, failed or open
    why: str  # for a failure: what went wrong, in a few words

    def as_json(self) -> dict[str, Any]:
        return {
            "remote_identifier": self.remote_identifier,
            "target": self.target,
            "request_uuid": self.request_uuid,
            "state": self.state,
            "drop_outcome": self.drop_outcome,
            "completed_at": self.completed_at.isoformat() if self.completed_at else None,
            "result": self.result,
            "why": self.why,
        }


@dataclass(frozen=True)
class CanaryRoundResult:
    canary_round: CanaryRound
    answers: list[CanaryAnswer] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Why the round fails (empty: it passed or is open)."""
        problems = [
            f"{name}: not registered as a consumer with a hash, nothing was sent"
            for name in self.canary_round.missing
        ]
        if not self.canary_round.targets:
            problems.append("the broker had no deletion target: nothing was sent")
        # One request per canary and target was sent: one that is gone was never answered
        # deleted, and the others' answers cannot stand for it.
        sent = len(self.canary_round.canaries) * self.canary_round.targets
        if len(self.answers) < sent:
            problems.append(
                f"{sent - len(self.answers)} of {sent} request(s) of the round no longer "
                "recorded: no answer to judge"
            )
        problems += [
            f"{answer.remote_identifier} at {answer.target}: {answer.why}"
            for answer in self.answers
            if answer.result == FAILED
        ]
        return problems

    @property
    def result(self) -> str:
        if self.problems:
            return FAILED
        if self.answers and all(answer.result == PASSED for answer in self.answers):
            return PASSED
        return OPEN

    def by_target(self) -> dict[str, list[CanaryAnswer]]:
        grouped: dict[str, list[CanaryAnswer]] = {}
        for answer in self.answers:
            grouped.setdefault(answer.target, []).append(answer)
        return grouped

    def as_json(self) -> dict[str, Any]:
        canary_round = self.canary_round
        return {
            "canary_round": canary_round.pk,
            "started_at": canary_round.started_at.isoformat(),
            "answer_by": canary_round.answer_by.isoformat(),
            "cycle": canary_round.cycle.drop_session_id if canary_round.cycle else None,
            "result": self.result,
            "canaries": canary_round.canaries,
            "missing": canary_round.missing,
            "targets": {
                target: [answer.as_json() for answer in answers]
                for target, answers in self.by_target().items()
            },
            "problems": self.problems,
        }


def _target(request: DeletionRequest) -> str:
    name = request.integration.name if request.integration else "no target"
    if request.isi_connection is not None:
        return f"{name} / {request.isi_connection.uuid}"
    return name


def _answer(request: DeletionRequest, *, answer_by: dt.datetime, now: dt.datetime) -> CanaryAnswer:
    result, why = OPEN, ""
    if request.state == RequestState.COMPLETED and request.drop_outcome == DropOutcome.DELETED:
        assert request.completed_at is not None  # set with every outcome
        if request.completed_at <= answer_by:
            result = PASSED
        else:
            result, why = FAILED, f"answered deleted after {answer_by.isoformat()}"
    elif request.drop_outcome:  # completed with another outcome, or failed
        detail = f" ({request.error_message})" if request.error_message else ""
        result, why = FAILED, f"answered {request.drop_outcome}{detail}"
    elif request.state in (RequestState.UNDELIVERABLE, RequestState.CANCELLED):
        result, why = FAILED, f"{request.state}: {request.last_error or 'no answer possible'}"
    elif now > answer_by:
        result, why = FAILED, f"no answer by {answer_by.isoformat()} (state {request.state})"
    return CanaryAnswer(
        remote_identifier=request.remote_identifier,
        target=_target(request),
        request_uuid=str(request.request_uuid),
        state=request.state,
        drop_outcome=request.drop_outcome,
        completed_at=request.completed_at,
        error_message=request.error_message,
        result=result,
        why=why,
    )


def canary_round_results(
    *, rounds: QuerySet[CanaryRound] | Iterable[CanaryRound], now: dt.datetime
) -> list[CanaryRoundResult]:
    """Each of ``rounds`` (in their order) with its answers, judged at ``now``."""
    rounds = list(rounds)
    answers: dict[int, list[CanaryAnswer]] = {r.pk: [] for r in rounds}
    answer_by = {r.pk: r.answer_by for r in rounds}
    requests = (
        DeletionRequest.objects.filter(canary_round__in=[r.pk for r in rounds])
        .select_related("integration", "isi_connection")
        .order_by("canary_round_id", "remote_identifier", "integration__name", "pk")
    )
    for request in requests:
        assert request.canary_round_id is not None  # the filter
        answers[request.canary_round_id].append(
            _answer(request, answer_by=answer_by[request.canary_round_id], now=now)
        )
    return [CanaryRoundResult(r, answers[r.pk]) for r in rounds]


def canary_rounds_failing(*, now: dt.datetime) -> list[CanaryRoundResult]:
    """Every broker's failed rounds since its latest passed one: the deletion system failed
    its test and has not passed one since (a later round that passes ends the alert)."""
    failing = []
    for broker_id in (
        CanaryRound.objects.order_by("broker_id").values_list("broker_id", flat=True).distinct()
    ):
        rounds = CanaryRound.objects.filter(broker_id=broker_id).select_related("broker", "cycle")
        results = canary_round_results(rounds=rounds.order_by("-started_at", "-pk")[:50], now=now)
        for result in results:
            if result.result == PASSED:
                break
            if result.result == FAILED:
                failing.append(result)
    return failing
