"""The SQL functions (``integrations/sql/``) apply rules defined once in Python, in the model
enums and ``integrations.models.requests``: these tests hold the SQL to those definitions.

The SQL spells out state names and status codes as literals rather than taking them as
parameters (a function's text is frozen per migration: changing it ships a new one). So every
bare-word literal in the SQL must stand in a position listed here, where it is checked
against its enum (a new one fails until it is listed), and the rules themselves (precedence,
final outcomes, which outcomes are taken) are compared with the Python definitions, first as
written in the source files, then as the migrated functions behave (tests/sql/test_sql_functions.py
holds the two to each other). Raw SQL in Python modules takes states as parameters.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from integrations.drop import files, reporting
from integrations.models import (
    DROP_STATUS_ALL_CANCELLED,
    DROP_STATUS_CODES,
    DROP_STATUS_PRECEDENCE,
    OUTCOME_REFUSING_STATES,
    OUTCOMES_NOT_FINAL,
    Broker,
    DeletionRequest,
    DropOutcome,
    DropStatus,
    IntegrationKind,
    RequestState,
    ResolutionRequest,
    WorkItem,
    WorkItemState,
)
from integrations.services.ledger import SYSTEM_ACTOR
from integrations.services.outcomes import OutcomeConflict
from integrations.services.resolutions import resolution_outcome_record
from integrations.services.work_items import work_item_settle
from tests.builders import (
    cycle_make,
    integration_make,
    item_make,
    request_make,
    resolution_make,
)

SQL_DIR = Path(settings.BASE_DIR) / "integrations" / "sql"
INTEGRATIONS_DIR = Path(settings.BASE_DIR) / "integrations"

_LITERAL = re.compile(r"'((?:[^']|'')*)'")
_WORD = re.compile(r"[a-z_]+")
_LIST = r"\(\s*'[^']*'(?:\s*,\s*'[^']*')*\s*\)"
_ONE = r"'[^']*'"

REQUEST_STATES = set(RequestState.values)
WORK_ITEM_STATES = set(WorkItemState.values)
# A request's drop_outcome: "" while it has none.
OUTCOMES = {"", *DropOutcome.values}
# work_item_settle.sql's own names for the three tables its union reads.
SETTLE_KINDS = {"deletion", "resolution", "saas"}


@dataclass(frozen=True)
class Position:
    """Where literals stand in a state position (the group ``v``), and the values allowed."""

    pattern: str
    allowed: set[str]
    what: str


_V_ONE = rf"(?P<v>{_ONE})"
_V_ONE_OR_LIST = rf"(?P<v>{_LIST}|{_ONE})"
_V_WORD = r"(?P<v>'[a-z_]*')"  # a value, not a piece of JSON
_POSITIONS: dict[str, list[Position]] = {
    "work_item_settle.sql": [
        Position(rf"\bwi\.state\s*(?:=|<>)\s*{_V_ONE}", WORK_ITEM_STATES, "WorkItemState"),
        Position(rf"\br\.state\s*(?:=|<>)\s*{_V_ONE}", REQUEST_STATES, "RequestState"),
        Position(rf"\br\.outcome\s*(?:=|<>|NOT IN|IN)\s*{_V_ONE_OR_LIST}", OUTCOMES, "DropOutcome"),
        Position(r"ARRAY\[(?P<v>\s*'[^\]]*)\]", OUTCOMES, "DropOutcome"),
        # The union's names for its tables, and the comparisons with them.
        Position(rf"SELECT\s+{_V_WORD}", SETTLE_KINDS, "name of the union's kinds"),
        Position(rf"\br\.kind\s*(?:=|IN)\s*{_V_ONE_OR_LIST}", SETTLE_KINDS, "union's kind"),
        # dropportal_work_item_status_fields: the state that follows from a code (and the
        # status_reason emptied, "").
        Position(rf"(?:THEN|ELSE)\s+{_V_WORD}", WORK_ITEM_STATES | {""}, "WorkItemState"),
        Position(r"coalesce\([^()]*,\s*(?P<v>'null')\)", {"null"}, "JSON null"),
    ],
    "deletion_outcome_record.sql": [
        Position(rf"\bd\.state\s*(?:=|<>)\s*{_V_ONE}", REQUEST_STATES, "RequestState"),
        Position(
            rf"\b(?:d\.drop_outcome|p_outcome)\s*(?:=|<>|NOT IN|IN)\s*{_V_ONE_OR_LIST}",
            OUTCOMES,
            "DropOutcome",
        ),
        Position(rf"dropportal_work_item_settle\(\s*\w+\s*,\s*{_V_ONE}\)", {SYSTEM_ACTOR}, "actor"),
    ],
    "api_key_lookup.sql": [
        Position(
            rf"\b(?:i\.kind\s*=|p_kind IS DISTINCT FROM)\s*{_V_ONE}",
            set(IntegrationKind.values),
            "IntegrationKind",
        ),
    ],
    "ledger_append.sql": [
        Position(r",\s*(?P<v>'hex')\)", {"hex"}, "encoding"),
    ],
}


def _sql(name: str) -> str:
    """The file without its comments (no literal in these files holds ``--``)."""
    text = (SQL_DIR / name).read_text(encoding="utf-8")
    return re.sub(r"--[^\n]*", "", text)


def _literals(text: str) -> list[str]:
    return [m.group(1).replace("''", "'") for m in _LITERAL.finditer(text)]


def test_every_sql_file_is_listed() -> None:
    assert {path.name for path in SQL_DIR.glob("*.sql")} == set(_POSITIONS)


@pytest.mark.parametrize("name", sorted(_POSITIONS))
def test_every_state_literal_in_the_sql_is_one_of_its_enum(name: str) -> None:
    text = _sql(name)
    covered: set[int] = set()
    wrong: list[str] = []
    for position in _POSITIONS[name]:
        matches = list(re.finditer(position.pattern, text))
        assert matches, f"{name}: nothing stands where {position.pattern!r} expects it"
        for match in matches:
            for literal in _LITERAL.finditer(match.group("v")):
                covered.add(match.start("v") + literal.start())
                value = literal.group(1)
                if value not in position.allowed:
                    wrong.append(f"{value!r} is not a {position.what}: {match.group(0)!r}")
    # Every bare word (a state name's shape) must stand in a position listed above.
    unlisted = [
        m.group(0)
        for m in _LITERAL.finditer(text)
        if _WORD.fullmatch(m.group(1)) and m.start() not in covered
    ]
    assert not wrong, f"{name}: {wrong}"
    assert not unlisted, (
        f"{name}: {unlisted} stand where this test does not know what they name; add their "
        "position to _POSITIONS with the enum they belong to"
    )


def _settle_ranking() -> tuple[list[int], list[str]]:
    match = re.search(
        r"\(ARRAY\[([\d,\s]+)\]\)\[min\(.*?array_position\(\s*ARRAY\[([^\]]*)\]",
        _sql("work_item_settle.sql"),
        re.DOTALL,
    )
    assert match, "work_item_settle.sql: the ranking of outcomes is not where expected"
    return [int(code) for code in match.group(1).split(",")], _literals(match.group(2))


def test_the_sql_ranks_outcomes_by_the_python_precedence() -> None:
    codes, outcomes = _settle_ranking()
    assert codes == [int(status) for status in DROP_STATUS_PRECEDENCE]
    assert [DROP_STATUS_CODES[outcome] for outcome in outcomes] == codes


def test_the_sqls_final_outcomes_are_those_with_a_drop_status() -> None:
    text = _sql("work_item_settle.sql")
    (final,) = re.findall(rf"\br\.outcome\s+NOT IN\s*({_LIST})", text)
    assert set(_literals(final)) == set(DROP_STATUS_CODES)
    assert set(DROP_STATUS_CODES) == OUTCOMES - set(OUTCOMES_NOT_FINAL)
    # Not final: the request keeps its work item open.
    for outcome in re.findall(rf"\br\.outcome\s*=\s*({_ONE})", text):
        assert _literals(outcome)[0] in OUTCOMES_NOT_FINAL


def test_the_sqls_status_codes_are_drop_statuses() -> None:
    text = _LITERAL.sub("''", _sql("work_item_settle.sql"))
    (all_cancelled,) = re.findall(r"v_code\s*:=\s*(\d+)", text)
    assert int(all_cancelled) == DROP_STATUS_ALL_CANCELLED
    codes, _ = _settle_ranking()
    assert set(codes) == set(DropStatus.values)
    # Any other number is a count compared with zero, not a status.
    numbers = [int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", text)]
    assert sorted(n for n in numbers if n) == sorted([*codes, int(all_cancelled)])


def test_the_sql_takes_outcomes_by_the_python_rule() -> None:
    text = _sql("deletion_outcome_record.sql")
    where = re.search(
        r"UPDATE integrations_deletionrequest d.*?WHERE(.*?)RETURNING", text, re.DOTALL
    )
    assert where, "deletion_outcome_record.sql: the UPDATE's WHERE is not where expected"
    (open_outcomes,) = re.findall(rf"\bd\.drop_outcome\s+IN\s*({_LIST})", where.group(1))
    assert set(_literals(open_outcomes)) == set(OUTCOMES_NOT_FINAL)
    refused = re.findall(rf"\bd\.state\s*<>\s*({_ONE})", where.group(1))
    assert {_literals(state)[0] for state in refused} == set(OUTCOME_REFUSING_STATES)


def test_the_response_files_take_the_drop_statuses() -> None:
    # drop.files is pure Python, without Django: it keeps its own copy, held here.
    assert set(DropStatus.values) == files.REPORTABLE_STATUSES
    rows = reporting._ROWS_RE
    for code in range(10):
        assert bool(rows.fullmatch(b"A1b2C3d4E5f6,%d\r\n" % code)) is (code in DropStatus.values)


# Raw SQL in Python takes state names as parameters; these literals are not states.
_PYTHON_SQL_LITERALS_ALLOWED = {
    # procrastinate's job statuses, not ours
    ("operations/metrics.py", "status IN ('todo', 'doing', 'failed')"),
    # a ledger event kind
    ("services/evidence.py", "kind = 'drop_cycle.reported'"),
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


# --- The same rules, as the functions behave ----------------------------------------------


FINAL = list(DROP_STATUS_CODES)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("first", "second"), list(itertools.combinations_with_replacement(FINAL, 2))
)
def test_settling_picks_the_status_first_in_the_precedence(
    broker: Broker, first: str, second: str
) -> None:
    item = item_make(cycle_make(broker))
    request_make(item, outcome=first)
    request_make(item, outcome=second, remote_identifier="C-2")
    codes = {DROP_STATUS_CODES[first], DROP_STATUS_CODES[second]}
    expected = next(status for status in DROP_STATUS_PRECEDENCE if status in codes)
    assert work_item_settle(work_item=item).status_code == expected


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("deletion", "resolution"),
    list(itertools.product(FINAL, [DropOutcome.OPTED_OUT, DropOutcome.EXEMPT])),
)
def test_a_resolutions_outcome_takes_its_place_in_the_precedence(
    broker: Broker, deletion: str, resolution: str
) -> None:
    item = item_make(cycle_make(broker))
    request_make(item, outcome=deletion)
    resolution_make(item, integration_make(broker), outcome=resolution)
    codes = {DROP_STATUS_CODES[deletion], DROP_STATUS_CODES[resolution]}
    expected = next(status for status in DROP_STATUS_PRECEDENCE if status in codes)
    assert work_item_settle(work_item=item).status_code == expected


@pytest.mark.django_db
def test_every_request_cancelled_settles_to_the_python_status(broker: Broker) -> None:
    item = item_make(cycle_make(broker))
    request_make(item, state=RequestState.CANCELLED)
    assert work_item_settle(work_item=item).status_code == DROP_STATUS_ALL_CANCELLED


_RECORD = "SELECT dropportal_deletion_outcome_record(%s, %s, %s, %s, %s, %s, %s, %s, %s)"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("state", "current"), list(itertools.product(RequestState.values, sorted(OUTCOMES)))
)
def test_a_deletion_takes_an_outcome_by_the_python_rule(
    broker: Broker, state: str, current: str
) -> None:
    item = item_make(cycle_make(broker))
    request = request_make(item, state=state, outcome=current, error_message="timeout")
    with connection.cursor() as cursor:
        cursor.execute(
            _RECORD,
            [
                request.pk,
                RequestState.COMPLETED,
                DropOutcome.DELETED,
                DROP_STATUS_CODES[DropOutcome.DELETED],
                "",
                timezone.now(),
                None,
                "test",
                "{}",
            ],
        )
        (recorded,) = cursor.fetchone()
    taken = state not in OUTCOME_REFUSING_STATES and current in OUTCOMES_NOT_FINAL
    assert recorded is taken
    assert DeletionRequest.objects.get(pk=request.pk).drop_outcome == (
        DropOutcome.DELETED if taken else current
    )


@pytest.mark.django_db
@pytest.mark.parametrize("state", RequestState.values)
def test_an_unanswered_resolution_takes_an_answer_by_the_python_rule(
    broker: Broker, state: str
) -> None:
    item = item_make(cycle_make(broker))
    resolution = resolution_make(item, integration_make(broker), state=state)
    assert resolution.completed_at is None
    taken = state not in OUTCOME_REFUSING_STATES
    try:
        result = resolution_outcome_record(
            resolution_request=resolution,
            drop_outcome=DropOutcome.EXEMPT,
            exemption_basis="legal hold",
            identifiers={},
            actor="test",
        )
    except OutcomeConflict:
        assert not taken
    else:
        assert taken and result.changed
    stored = ResolutionRequest.objects.get(pk=resolution.pk)
    assert (stored.drop_outcome == DropOutcome.EXEMPT) is taken


@pytest.mark.django_db
def test_an_answered_resolution_takes_no_other_answer(broker: Broker) -> None:
    item = item_make(cycle_make(broker))
    resolution = resolution_make(item, integration_make(broker), state=RequestState.DISPATCHED)
    resolution_outcome_record(
        resolution_request=resolution,
        drop_outcome=DropOutcome.OPTED_OUT,
        exemption_basis="",
        identifiers={},
        actor="test",
        opt_out_email="ann@example.com",
    )
    with pytest.raises(OutcomeConflict):
        resolution_outcome_record(
            resolution_request=resolution,
            drop_outcome=DropOutcome.EXEMPT,
            exemption_basis="legal hold",
            identifiers={},
            actor="test",
        )
    assert WorkItem.objects.get(pk=item.pk).status_code == DropStatus.OPTED_OUT
