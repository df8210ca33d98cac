"""The outcome and settlement rules, as the SQL functions and the services apply them.

The rules are defined once, in ``integrations.models.requests``, and the SQL functions
(``integrations/sql/``) take them as arguments; these tests state what a broker and DROP see:
which status a work item settles to, and which answers are taken, repeated or refused, for
deletions and resolutions alike. Raw SQL in Python takes state names as parameters.
"""

from __future__ import annotations

import io
import itertools
import re
from pathlib import Path

import pytest
from django.conf import settings

from integrations.drop import files, reporting
from integrations.drop_statuses import STATUS_CODES, DropStatus
from integrations.models import (
    Broker,
    DeletionRequest,
    DropOutcome,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    WorkItem,
)
from integrations.models import requests as request_rules
from integrations.services.cycle.work_items import work_item_settle
from integrations.services.dispatch.outcomes import OutcomeConflict, deletion_outcome_record
from integrations.services.dispatch.resolutions import resolution_outcome_record
from tests.builders import (
    DeletionRequestFactory,
    DropCycleFactory,
    ResolutionRequestFactory,
    WebhookIntegrationFactory,
    WorkItemFactory,
)

INTEGRATIONS_DIR = Path(settings.BASE_DIR) / "integrations"
_LIST = r"\(\s*'[^']*'(?:\s*,\s*'[^']*')*\s*\)"
_ONE = r"'[^']*'"


def test_the_response_files_take_the_drop_statuses() -> None:
    # The writer and the reader of response files both take drop_statuses' codes.
    rows = reporting._ROWS_RE
    for code in range(10):
        assert bool(rows.fullmatch(b"A1b2C3d4E5f6,%d\r\n" % code)) is (code in STATUS_CODES)
        written = io.BytesIO()
        if code in STATUS_CODES:
            files.write_response_csv(written, [("A1b2C3d4E5f6", code)])
        else:
            with pytest.raises(files.DropFileError):
                files.write_response_csv(written, [("A1b2C3d4E5f6", code)])


# Raw SQL in Python takes state names as parameters; these literals are not states.
_PYTHON_SQL_LITERALS_ALLOWED = {
    # procrastinate's job statuses, not ours
    ("operations/metrics.py", "status IN ('todo', 'doing', 'failed')"),
}


def test_raw_sql_in_python_takes_states_as_parameters() -> None:
    found = set()
    pattern = re.compile(
        rf"\b\w*(?:state|outcome|status|kind)\s*(?:=|<>|!=|IN|NOT IN)\s*(?:{_LIST}|{_ONE})"
    )
    for path in INTEGRATIONS_DIR.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            found.add((path.relative_to(INTEGRATIONS_DIR).as_posix(), match.group(0)))
    assert found == _PYTHON_SQL_LITERALS_ALLOWED


# --- Settlement: which status a work item gets ----------------------------------------------

# Each final outcome and the status it reports, strongest first: opted_out (4) over deleted
# (3) over exempt (2) over not_found (5).
STRONGEST_FIRST: list[tuple[str, int]] = [
    (DropOutcome.OPTED_OUT, DropStatus.OPTED_OUT),
    (DropOutcome.DELETED, DropStatus.DELETED),
    (DropOutcome.EXEMPT, DropStatus.EXEMPT),
    (DropOutcome.NOT_FOUND, DropStatus.NOT_FOUND),
]
_RANK: dict[str, int] = {outcome: rank for rank, (outcome, _) in enumerate(STRONGEST_FIRST)}
_STATUS: dict[str, int] = dict(STRONGEST_FIRST)
FINAL = [outcome for outcome, _ in STRONGEST_FIRST]


def _strongest(*outcomes: str) -> int:
    return _STATUS[min(outcomes, key=_RANK.__getitem__)]


@pytest.mark.django_db
@pytest.mark.parametrize(("outcome", "status"), STRONGEST_FIRST)
def test_one_final_outcome_settles_to_its_status(broker: Broker, outcome: str, status: int) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, drop_outcome=outcome)
    settled = work_item_settle(work_item=item)
    assert (settled.status_code, settled.state) == (status, "reportable")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("first", "second"), list(itertools.combinations_with_replacement(FINAL, 2))
)
def test_settling_picks_the_strongest_outcome(broker: Broker, first: str, second: str) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, drop_outcome=first)
    DeletionRequestFactory.create(work_item=item, drop_outcome=second, remote_identifier="C-2")
    assert work_item_settle(work_item=item).status_code == _strongest(first, second)


@pytest.mark.django_db
def test_changing_the_precedence_is_one_edit_in_models(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe of docs/architecture.md: reorder DROP_STATUS_PRECEDENCE and both SQL paths
    (settling, and recording a callback's outcome) follow, with nothing else changed."""
    monkeypatch.setattr(
        request_rules,
        "DROP_STATUS_PRECEDENCE",
        (DropStatus.NOT_FOUND, DropStatus.EXEMPT, DropStatus.DELETED, DropStatus.OPTED_OUT),
    )
    cycle = DropCycleFactory.create(broker=broker)
    settled = WorkItemFactory.create(cycle=cycle)
    DeletionRequestFactory.create(work_item=settled, drop_outcome=DropOutcome.OPTED_OUT)
    DeletionRequestFactory.create(
        work_item=settled, drop_outcome=DropOutcome.NOT_FOUND, remote_identifier="C-2"
    )
    assert work_item_settle(work_item=settled).status_code == DropStatus.NOT_FOUND

    recorded = WorkItemFactory.create(cycle=cycle)
    DeletionRequestFactory.create(work_item=recorded, drop_outcome=DropOutcome.EXEMPT)
    open_request = DeletionRequestFactory.create(
        work_item=recorded, state=RequestState.DISPATCHED, remote_identifier="C-3"
    )
    deletion_outcome_record(
        deletion_request=open_request, drop_outcome=DropOutcome.DELETED, actor="test"
    )
    assert WorkItem.objects.get(pk=recorded.pk).status_code == DropStatus.EXEMPT


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("deletion", "resolution"),
    list(itertools.product(FINAL, [DropOutcome.OPTED_OUT, DropOutcome.EXEMPT])),
)
def test_a_resolutions_outcome_takes_its_place_in_the_precedence(
    broker: Broker, deletion: str, resolution: str
) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, drop_outcome=deletion)
    ResolutionRequestFactory.create(
        work_item=item,
        integration=WebhookIntegrationFactory.create(broker=broker),
        drop_outcome=resolution,
        completed=True,
    )
    assert work_item_settle(work_item=item).status_code == _strongest(deletion, resolution)


@pytest.mark.django_db
@pytest.mark.parametrize("outcome", ["", DropOutcome.FAILED])
def test_an_outcome_that_is_not_final_keeps_the_item_open(broker: Broker, outcome: str) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, drop_outcome=DropOutcome.DELETED)
    DeletionRequestFactory.create(work_item=item, drop_outcome=outcome, remote_identifier="C-2")
    settled = work_item_settle(work_item=item)
    assert (settled.status_code, settled.state) == (None, "open")


@pytest.mark.django_db
def test_every_request_cancelled_settles_to_not_found(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, state=RequestState.CANCELLED)
    DeletionRequestFactory.create(
        work_item=item, state=RequestState.CANCELLED, remote_identifier="C-2"
    )
    settled = work_item_settle(work_item=item)
    assert (settled.status_code, settled.state) == (DropStatus.NOT_FOUND, "reportable")


@pytest.mark.django_db
def test_a_cancelled_request_does_not_count(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    DeletionRequestFactory.create(work_item=item, state=RequestState.CANCELLED)
    DeletionRequestFactory.create(
        work_item=item, drop_outcome=DropOutcome.EXEMPT, remote_identifier="C-2"
    )
    assert work_item_settle(work_item=item).status_code == DropStatus.EXEMPT


# --- Which answers are taken: deletions -----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("state", "current"), list(itertools.product(RequestState.values, ["", *DropOutcome.values]))
)
def test_a_deletion_takes_an_outcome_unless_cancelled_or_final(
    broker: Broker, state: str, current: str
) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    request = DeletionRequestFactory.create(
        work_item=item, state=state, drop_outcome=current, error_message="timeout"
    )
    taken = state != RequestState.CANCELLED and current in ("", DropOutcome.FAILED)
    try:
        result = deletion_outcome_record(
            deletion_request=request, drop_outcome=DropOutcome.DELETED, actor="test"
        )
    except OutcomeConflict:
        assert not taken
    else:
        assert result.changed is taken  # not taken: the same final outcome, a repeat
        assert taken or current == DropOutcome.DELETED
    stored = DeletionRequest.objects.get(pk=request.pk)
    assert stored.drop_outcome == (DropOutcome.DELETED if taken else current)
    if taken:
        assert WorkItem.objects.get(pk=item.pk).status_code == DropStatus.DELETED


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("outcome", "email"),
    [(DropOutcome.DELETED, ""), (DropOutcome.OPTED_OUT, "Ann.Smith@Example.com ")],
)
def test_a_deletions_identical_repeat_is_accepted_and_changes_nothing(
    broker: Broker, outcome: str, email: str
) -> None:
    request = DeletionRequestFactory.create(
        work_item=WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker)),
        state=RequestState.DISPATCHED,
    )
    first = deletion_outcome_record(
        deletion_request=request, drop_outcome=outcome, opt_out_email=email, actor="test"
    )
    again = deletion_outcome_record(
        deletion_request=request, drop_outcome=outcome, opt_out_email=email, actor="test"
    )
    assert (first.changed, again.changed) == (True, False)
    assert LedgerEvent.objects.filter(kind="deletion_request.outcome_repeated").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("first", "second"),
    [
        ((DropOutcome.DELETED, ""), (DropOutcome.EXEMPT, "")),
        ((DropOutcome.OPTED_OUT, "ann@example.com"), (DropOutcome.OPTED_OUT, "bob@example.com")),
    ],
)
def test_a_deletions_conflicting_repeat_is_refused(
    broker: Broker, first: tuple[str, str], second: tuple[str, str]
) -> None:
    request = DeletionRequestFactory.create(
        work_item=WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker)),
        state=RequestState.DISPATCHED,
    )
    deletion_outcome_record(
        deletion_request=request, drop_outcome=first[0], opt_out_email=first[1], actor="test"
    )
    with pytest.raises(OutcomeConflict):
        deletion_outcome_record(
            deletion_request=request, drop_outcome=second[0], opt_out_email=second[1], actor="t"
        )
    assert DeletionRequest.objects.get(pk=request.pk).drop_outcome == first[0]


@pytest.mark.django_db
def test_a_failure_repeats_only_with_the_same_error(broker: Broker) -> None:
    request = DeletionRequestFactory.create(
        work_item=WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker)),
        state=RequestState.DISPATCHED,
    )

    def fail(error: str) -> bool:
        return deletion_outcome_record(
            deletion_request=request,
            drop_outcome=DropOutcome.FAILED,
            error_message=error,
            actor="t",
        ).changed

    assert fail("timeout")
    assert not fail("timeout")
    assert fail("disk full")
    assert DeletionRequest.objects.get(pk=request.pk).error_message == "disk full"


# --- Which answers are taken: resolutions ---------------------------------------------------


def _answer(resolution: ResolutionRequest, **answer: object) -> bool:
    fields: dict[str, object] = {
        "drop_outcome": DropOutcome.EXEMPT,
        "exemption_basis": "legal hold",
        "identifiers": {},
        **answer,
    }
    return resolution_outcome_record(
        resolution_request=resolution,
        actor="test",
        **fields,  # type: ignore[arg-type]
    ).changed


@pytest.mark.django_db
@pytest.mark.parametrize("state", RequestState.values)
def test_an_unanswered_resolution_takes_an_answer_unless_cancelled(
    broker: Broker, state: str
) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    resolution = ResolutionRequestFactory.create(
        work_item=item, integration=WebhookIntegrationFactory.create(broker=broker), state=state
    )
    assert resolution.completed_at is None
    taken = state != RequestState.CANCELLED
    try:
        assert _answer(resolution)
    except OutcomeConflict:
        assert not taken
    else:
        assert taken
    stored = ResolutionRequest.objects.get(pk=resolution.pk)
    assert (stored.drop_outcome == DropOutcome.EXEMPT) is taken


@pytest.mark.django_db
@pytest.mark.parametrize(
    "answer",
    [
        {"drop_outcome": DropOutcome.EXEMPT},
        {"drop_outcome": DropOutcome.OPTED_OUT, "opt_out_email": "ann@example.com"},
    ],
)
def test_a_resolutions_identical_repeat_is_accepted_and_changes_nothing(
    broker: Broker, answer: dict[str, str]
) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    resolution = ResolutionRequestFactory.create(
        work_item=item,
        integration=WebhookIntegrationFactory.create(broker=broker),
        state=RequestState.DISPATCHED,
    )
    assert _answer(resolution, **answer)
    assert not _answer(resolution, **answer)
    assert LedgerEvent.objects.filter(kind="resolution_request.outcome_repeated").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "second",
    [
        {"drop_outcome": DropOutcome.EXEMPT, "exemption_basis": "another basis"},
        {"drop_outcome": DropOutcome.OPTED_OUT, "opt_out_email": "bob@example.com"},
    ],
)
def test_a_resolutions_conflicting_repeat_is_refused(
    broker: Broker, second: dict[str, str]
) -> None:
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    resolution = ResolutionRequestFactory.create(
        work_item=item,
        integration=WebhookIntegrationFactory.create(broker=broker),
        state=RequestState.DISPATCHED,
    )
    assert _answer(resolution, drop_outcome=DropOutcome.OPTED_OUT, opt_out_email="ann@example.com")
    with pytest.raises(OutcomeConflict):
        _answer(resolution, **second)
    assert WorkItem.objects.get(pk=item.pk).status_code == DropStatus.OPTED_OUT
