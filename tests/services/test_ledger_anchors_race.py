"""The check of the kept tokens while an anchoring commits: a token that arrives while the
check reads is either checked against the chain or not seen at all, never reported as a
token whose chain hash is not the chain's (the ``ledger_anchor_broken`` alert says the
chain was rewritten).

This test commits (the anchoring runs on a connection of its own, in a thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from devtools.tsa_simulator import TsaSimulator
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerAnchor
from integrations.services.ledger import ledger_event_append
from integrations.services.ledger_anchors import ledger_anchor, ledger_anchors_verify
from tests.conftest import in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def some_events(n: int = 3) -> None:
    with transaction.atomic():
        for i in range(n):
            ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id="4821", data={"i": i})


def anchored_in_another_session() -> None:
    errors: list[BaseException] = []

    def events_then_anchor() -> None:
        some_events()
        ledger_anchor()

    in_thread(events_then_anchor, errors).join()
    assert errors == []


def test_a_token_kept_while_the_tokens_are_checked_is_no_problem(tsa: TsaSimulator) -> None:
    some_events()
    ledger_anchor()
    state = {"done": False}

    def after_the_first_read(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql, params, many, context)
        # Once the check has read anything of the chain, another session anchors anew.
        if not state["done"] and "integrations_ledgerchainlink" in sql:
            state["done"] = True
            anchored_in_another_session()
        return result

    with connection.execute_wrapper(after_the_first_read):
        checked, problems = ledger_anchors_verify()

    assert state["done"]
    assert LedgerAnchor.objects.count() == 2
    assert problems == []
    assert checked in (1, 2)
