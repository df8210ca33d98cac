"""The ledger: append-only in the database, chained by the sealer, verified end to end."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test.utils import CaptureQueriesContext

from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerChainLink, LedgerEvent
from integrations.services.ledger import (
    GENESIS_HASH,
    chain_hash,
    event_hash,
    ledger_event_append,
    ledger_events_append,
    ledger_seal,
    ledger_verify,
)

pytestmark = pytest.mark.django_db


def append(n: int) -> list[LedgerEvent]:
    return [
        ledger_event_append(
            kind=LedgerKind.BROKER_UPDATED,
            broker_id="4821",
            subject=f"s{i}",
            data={"i": i, "name": "é"},
        )
        for i in range(n)
    ]


def test_sealing_chains_every_event_in_order() -> None:
    events = append(5)
    assert ledger_seal() == 5
    links = list(LedgerChainLink.objects.order_by("position"))
    assert [link.event_id for link in links] == [e.id for e in events]
    expected = GENESIS_HASH
    for event, link in zip(events, links, strict=True):
        expected = chain_hash(expected, event.id, event.event_hash)
        assert link.chain_hash == expected
    assert ledger_seal() == 0  # nothing new


def test_sealing_in_batches_continues_the_chain() -> None:
    append(7)
    assert ledger_seal(batch_size=3) == 7
    append(2)
    assert ledger_seal(batch_size=3) == 2
    result = ledger_verify()
    assert result.ok
    assert result.chain_length == 9


def test_a_backlog_is_sealed_in_id_order_without_rereading_what_is_sealed() -> None:
    events = append(8)
    with CaptureQueriesContext(connection) as queries:
        assert ledger_seal(batch_size=3) == 8
    links = list(LedgerChainLink.objects.order_by("position"))
    assert [link.event_id for link in links] == [e.id for e in events]
    assert ledger_verify().ok
    # The candidates' reads: each after the first starts past the last event sealed, in the
    # events and in the chain, not over every event sealed since the horizon again
    # (quadratic in a backlog).
    reads = [q["sql"] for q in queries if q["sql"].startswith('SELECT "integrations_ledgerevent"')]
    assert len(reads) == 3
    for read, after in zip(reads, [0, events[2].id, events[5].id], strict=True):
        assert f'"integrations_ledgerevent"."id" > {after}' in read
        assert f'U0."event_id" > {after}' in read


def test_intact_ledger_verifies() -> None:
    append(4)
    ledger_seal()
    append(2)  # unsealed events are checked by their own hash
    result = ledger_verify()
    assert result.ok
    assert result.events_checked == 6
    assert result.chain_length == 4


# Every character class JSON escapes differently: quotes, backslash, the named control
# characters, the other control characters (\u00XX), DEL, non-ASCII, beyond the BMP, and the
# line and paragraph separators JavaScript cares about.
AWKWARD = '"q" \\ \b\f\n\r\t \x01\x1f\x7f é ü 中 😀 \u2028\u2029 </script>'


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"text": AWKWARD, AWKWARD: "as a key"},
        {"nested": {"list": [1, -2, 3.5, 1e-07, 10**20, True, False, None], "z": {"a": ""}}},
        {"every_control": "".join(chr(c) for c in range(1, 32))},
        # Numbers PostgreSQL's jsonb gives back in another form than Python writes them: a
        # float of 1e16 or more as its digits (an integer to json.loads), -0.0 as 0.0.
        {"floats": [1e16, -1.5e300, 1.2345678901234567e20, -0.0, 0.1, 5e-324, 1e-07]},
        # Keys JSON turns into text, which jsonb then sorts as text ("10" before "9").
        {"by_code": {10: "a", 9: "b", 1.5: "c", True: "d", None: "e"}, "mixed": {3: 1, "a": 2}},
    ],
)
def test_the_database_hashes_events_as_the_verifier_does(data: dict[str, object]) -> None:
    # The database writes every hash (sql/ledger_append.sql); ledger_verify recomputes
    # them in Python from what is stored. They must agree on any content.
    (event,) = ledger_events_append(
        [
            {
                "kind": LedgerKind.BROKER_UPDATED,
                "broker_id": "4821",
                "subject": AWKWARD,
                "actor": AWKWARD,
                "data": data,
            }
        ]
    )
    stored = LedgerEvent.objects.get(pk=event.pk)
    assert stored.event_hash == event.event_hash
    assert stored.data == event.data
    assert stored.event_hash == event_hash(
        created_at=stored.created_at,
        broker_id=stored.broker_id,
        kind=stored.kind,
        subject=stored.subject,
        actor=stored.actor,
        data=stored.data,
    )
    assert ledger_verify().ok


def test_subject_and_actor_are_cut_at_200_characters_before_hashing() -> None:
    event = ledger_event_append(kind=LedgerKind.BROKER_UPDATED, subject="s" * 300, actor="a" * 300)
    stored = LedgerEvent.objects.get(pk=event.pk)
    assert (len(stored.subject), len(stored.actor)) == (200, 200)
    assert ledger_verify().ok


@pytest.mark.parametrize("statement", ["UPDATE {t} SET kind = 'x'", "DELETE FROM {t}"])
@pytest.mark.parametrize("table", ["integrations_ledgerevent", "integrations_ledgerchainlink"])
def test_database_refuses_update_and_delete(statement: str, table: str) -> None:
    append(1)
    ledger_seal()
    sql = statement.format(t=table)
    if "chainlink" in table:
        sql = sql.replace("kind = 'x'", "chain_hash = 'x'")
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)


@pytest.mark.parametrize(
    "table",
    ["integrations_ledgerevent", "integrations_ledgerchainlink", "integrations_ledgeranchor"],
)
def test_database_refuses_truncate(table: str) -> None:
    """``manage.py flush`` or a cleanup script pointed at the wrong database stops here."""
    append(1)
    ledger_seal()
    with (
        pytest.raises(DatabaseError, match="append-only: TRUNCATE"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"TRUNCATE {table} CASCADE")
    assert LedgerEvent.objects.exists()


def _without_triggers(sql: str, params: list | None = None) -> None:
    """Tamper the way an attacker with the owner's rights would: drop the guard first."""
    with connection.cursor() as cursor:
        for table in ("integrations_ledgerevent", "integrations_ledgerchainlink"):
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        cursor.execute(sql, params or [])
        for table in ("integrations_ledgerevent", "integrations_ledgerchainlink"):
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def test_tampered_content_is_named() -> None:
    events = append(5)
    ledger_seal()
    _without_triggers(
        "UPDATE integrations_ledgerevent SET data = '{\"i\": 99}' WHERE id = %s", [events[2].id]
    )
    result = ledger_verify()
    assert result.first_break is not None
    assert result.first_break.event_id == events[2].id
    assert "content" in result.first_break.reason


def test_tampered_content_with_recomputed_hash_breaks_the_chain() -> None:
    events = append(5)
    ledger_seal()
    target = events[1]
    forged = event_hash(
        created_at=target.created_at,
        broker_id=target.broker_id,
        kind=target.kind,
        subject=target.subject,
        actor=target.actor,
        data={"i": 1000},
    )
    _without_triggers(
        "UPDATE integrations_ledgerevent SET data = '{\"i\": 1000}', event_hash = %s WHERE id = %s",
        [forged, target.id],
    )
    result = ledger_verify()
    assert result.first_break is not None
    assert result.first_break.event_id == target.id
    assert "chain" in result.first_break.reason


def test_deleted_event_is_named() -> None:
    events = append(3)
    ledger_seal()
    _without_triggers("DELETE FROM integrations_ledgerevent WHERE id = %s", [events[1].id])
    result = ledger_verify()
    assert result.first_break is not None
    assert result.first_break.event_id == events[1].id
    assert "missing" in result.first_break.reason


def test_verify_command_exits_1_naming_the_first_broken_event(capsys) -> None:
    events = append(3)
    call_command("ledger", "verify")
    assert "Ledger intact: 3 events checked" in capsys.readouterr().out
    _without_triggers(
        "UPDATE integrations_ledgerevent SET actor = 'mallory' WHERE id = %s", [events[0].id]
    )
    with pytest.raises(SystemExit) as exit_info:
        call_command("ledger", "verify")
    assert exit_info.value.code == 1
    assert f"event {events[0].id}" in capsys.readouterr().err


def test_event_rolled_back_with_its_change_leaves_no_trace() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
        raise RuntimeError
    assert not LedgerEvent.objects.filter(kind="broker.updated").exists()
    assert ledger_verify().ok


def test_an_unregistered_kind_is_refused_and_nothing_is_written() -> None:
    with pytest.raises(ValueError, match=r"unknown ledger kind 'broker\.renamed'"):
        ledger_event_append(kind="broker.renamed")  # type: ignore[arg-type]
    # In a batch, one unregistered kind refuses the whole INSERT.
    with pytest.raises(ValueError, match=r"unknown ledger kind 'test\.event'"):
        ledger_events_append([{"kind": LedgerKind.BROKER_UPDATED}, {"kind": "test.event"}])
    assert not LedgerEvent.objects.exists()


def test_a_kind_is_stored_as_the_plain_string_it_stands_for() -> None:
    (event,) = ledger_events_append([{"kind": "broker.updated"}])
    assert type(event.kind) is str and event.kind == "broker.updated"
    assert LedgerEvent.objects.get(pk=event.pk).kind == "broker.updated"
    assert ledger_verify().ok
