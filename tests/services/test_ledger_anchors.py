"""The ledger anchored outside: a loopback RFC 3161 authority (``openssl ts -reply`` under a
CA made for the test) timestamps the chain head; its tokens are kept, checked, and alerted on
when the authority fails."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.utils import timezone
from procrastinate.contrib.django import app

from devtools.tsa_simulator import TsaSimulator
from integrations import tasks
from integrations.evidence.timestamps import load_certificates, token_gen_time
from integrations.ledger_hash import chain_hash, event_hash
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerAnchor, LedgerChainLink, LedgerEvent
from integrations.services.ledger import ledger_event_append
from integrations.services.ledger_anchors import (
    AnchorFailed,
    AnchorNotConfigured,
    ledger_anchor,
    ledger_anchors_verify,
)
from integrations.services.staff.alerts import alerts_evaluate
from tests.builders import anchor_moved_to_head

pytestmark = pytest.mark.django_db


def some_events(n: int = 3) -> None:
    with transaction.atomic():
        for i in range(n):
            ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id="4821", data={"i": i})


def test_anchoring_timestamps_the_chain_head_and_keeps_the_token(tsa: TsaSimulator) -> None:
    some_events()
    anchor = ledger_anchor(actor="cli:alice")
    head = LedgerChainLink.objects.get(position=anchor.position)
    # The head as it was when asked: the three events, sealed first.
    assert LedgerChainLink.objects.count() == 3
    assert (anchor.event_id, anchor.chain_hash) == (head.event_id, head.chain_hash)
    token = bytes(anchor.token)
    assert anchor.token_sha256 == hashlib.sha256(token).hexdigest()
    assert anchor.gen_time == token_gen_time(token)
    assert abs((timezone.now() - anchor.gen_time).total_seconds()) < 60
    event = LedgerEvent.objects.get(kind=LedgerKind.LEDGER_ANCHORED)
    assert event.actor == "cli:alice"
    assert event.data == {
        "position": anchor.position,
        "event_id": anchor.event_id,
        "chain_hash": anchor.chain_hash,
        "token_sha256": anchor.token_sha256,
        "gen_time": anchor.gen_time.isoformat(),
        "tsa_url": tsa.url,
    }
    assert ledger_anchors_verify(authorities=load_certificates(tsa.ca_pem)) == (1, [])


def test_a_second_anchoring_covers_the_first_ones_event(tsa: TsaSimulator) -> None:
    some_events()
    first = ledger_anchor()
    second = ledger_anchor()
    # The ledger.anchored event of the first is in the chain the second covers.
    anchored = LedgerEvent.objects.get(
        kind=LedgerKind.LEDGER_ANCHORED, data__position=first.position
    )
    assert LedgerChainLink.objects.get(event_id=anchored.id).position <= second.position
    assert second.position > first.position
    assert ledger_anchors_verify(authorities=load_certificates(tsa.ca_pem)) == (2, [])


def test_without_an_authority_there_is_nothing_to_ask(settings: Any) -> None:
    settings.DROPPORTAL_TSA_URL = ""
    some_events()
    with pytest.raises(AnchorNotConfigured, match="DROPPORTAL_TSA_URL is not set"):
        ledger_anchor()
    assert not LedgerAnchor.objects.exists()


def test_a_failing_authority_is_a_ledger_event_and_an_alert_until_it_works(
    tsa: TsaSimulator,
) -> None:
    some_events()
    tsa.refuse_next(503)
    with pytest.raises(AnchorFailed, match="HTTP 503"):
        ledger_anchor()
    assert not LedgerAnchor.objects.exists()
    failed = LedgerEvent.objects.get(kind=LedgerKind.LEDGER_ANCHOR_FAILED)
    assert failed.data["error"] == "HTTP 503" and failed.data["tsa_url"] == tsa.url
    raised = alerts_evaluate().raised
    assert [alert.condition for alert in raised] == ["ledger_anchor_failed"]
    assert "HTTP 503" in raised[0].text

    ledger_anchor()  # tried again: the authority answers
    assert [alert.condition for alert in alerts_evaluate().cleared] == ["ledger_anchor_failed"]


def test_an_answer_that_is_not_a_token_is_refused(tsa: TsaSimulator, monkeypatch: Any) -> None:
    some_events()
    monkeypatch.setattr(tsa, "reply", lambda query: b"<html>maintenance</html>")
    with pytest.raises(AnchorFailed, match="not an RFC 3161 time-stamp response"):
        ledger_anchor()
    assert LedgerEvent.objects.filter(kind=LedgerKind.LEDGER_ANCHOR_FAILED).count() == 1


def test_a_token_over_another_head_is_refused_when_it_comes(
    tsa: TsaSimulator, monkeypatch: Any
) -> None:
    some_events()
    other = tsa.timestamp("f" * 64)
    monkeypatch.setattr(tsa, "reply", lambda query: other)
    with pytest.raises(AnchorFailed, match="it covers another chain head"):
        ledger_anchor()
    assert not LedgerAnchor.objects.exists()


def test_a_kept_token_of_another_chain_head_fails_and_is_named(tsa: TsaSimulator) -> None:
    some_events()
    good = ledger_anchor()
    some_events()
    forged = anchor_moved_to_head(good)
    checked, problems = ledger_anchors_verify(authorities=load_certificates(tsa.ca_pem))
    assert checked == 2
    assert [str(problem) for problem in problems] == [
        f"the token of position {forged.position} (anchor {forged.id}): it covers another "
        f"chain head, not {forged.chain_hash}"
    ]


def test_a_token_signed_under_another_authority_fails_with_its_certificate(
    tsa: TsaSimulator,
) -> None:
    some_events()
    anchor = ledger_anchor()
    with TsaSimulator(name="another TSA") as other:
        _, problems = ledger_anchors_verify(authorities=load_certificates(other.ca_pem))
    assert len(problems) == 1 and problems[0].position == anchor.position
    assert "does not chain to the given certificate" in problems[0].reason


def test_anchors_are_append_only(tsa: TsaSimulator) -> None:
    some_events()
    anchor = ledger_anchor()
    for statement in (
        "UPDATE integrations_ledgeranchor SET chain_hash = 'x' WHERE id = %s",
        "DELETE FROM integrations_ledgeranchor WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement, [anchor.id])


def test_the_daily_job_anchors_when_an_authority_is_set(tsa: TsaSimulator, settings: Any) -> None:
    periodic = app.periodic_registry.periodic_tasks[
        ("integrations.tasks.anchor_ledger", "anchor_ledger")
    ]
    assert periodic.cron == "7 4 * * *"  # once a day
    some_events()
    position = tasks.anchor_ledger()
    assert position == LedgerAnchor.objects.get().position
    settings.DROPPORTAL_TSA_URL = ""
    assert tasks.anchor_ledger() is None
    assert LedgerAnchor.objects.count() == 1


def test_the_daily_job_fails_so_it_is_tried_again(tsa: TsaSimulator) -> None:
    some_events()
    tsa.refuse_next(500)
    with pytest.raises(AnchorFailed):
        tasks.anchor_ledger()
    assert tasks.anchor_ledger() == LedgerAnchor.objects.get().position


def test_the_nightly_verify_alerts_when_a_token_no_longer_covers_the_chain(
    tsa: TsaSimulator,
) -> None:
    some_events()
    anchor = ledger_anchor()
    assert tasks.verify_ledger() is True
    checked = LedgerEvent.objects.get(kind=LedgerKind.LEDGER_ANCHORS_VERIFIED)
    assert checked.data == {"ok": True, "anchors_checked": 1, "problems": [], "problems_count": 0}
    assert alerts_evaluate().raised == []
    # The chain rewritten whole by someone with the owner's rights: every event and link
    # recomputed (so the chain still verifies), and the anchor's stored hash to match; only
    # the authority's token still names the old head.
    with connection.cursor() as cursor:
        for table in ("ledgerevent", "ledgerchainlink", "ledgeranchor"):
            cursor.execute(f"ALTER TABLE integrations_{table} DISABLE TRIGGER USER")
        first = LedgerEvent.objects.order_by("id").first()
        assert first is not None
        rewritten = event_hash(
            created_at=first.created_at,
            broker_id=first.broker_id,
            kind=first.kind,
            subject="rewritten",
            actor=first.actor,
            data=first.data,
        )
        cursor.execute(
            "UPDATE integrations_ledgerevent SET subject = 'rewritten', event_hash = %s "
            "WHERE id = %s",
            [rewritten, first.id],
        )
        previous = "0" * 64
        cursor.execute(
            "SELECT l.position, e.id, e.event_hash FROM integrations_ledgerchainlink l "
            "JOIN integrations_ledgerevent e ON e.id = l.event_id ORDER BY l.position"
        )
        for position, event_id, content in cursor.fetchall():
            previous = chain_hash(previous, event_id, content)
            cursor.execute(
                "UPDATE integrations_ledgerchainlink SET chain_hash = %s WHERE position = %s",
                [previous, position],
            )
            if position == anchor.position:
                cursor.execute(
                    "UPDATE integrations_ledgeranchor SET chain_hash = %s WHERE id = %s",
                    [previous, anchor.id],
                )
        for table in ("ledgerevent", "ledgerchainlink", "ledgeranchor"):
            cursor.execute(f"ALTER TABLE integrations_{table} ENABLE TRIGGER USER")
    assert tasks.verify_ledger() is False
    assert LedgerEvent.objects.filter(kind=LedgerKind.LEDGER_VERIFIED).latest("id").data["ok"]
    raised = alerts_evaluate().raised
    assert [alert.condition for alert in raised] == ["ledger_anchor_broken"]
    assert f"the token of position {anchor.position}" in raised[0].text
    assert "it covers another chain head" in raised[0].text
