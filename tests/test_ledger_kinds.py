"""The registry of ledger kinds holds every kind any write path can produce: the literals of
the SQL functions, and the kinds the delivery loop and the staff admin compose at run time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from integrations.ledger_kinds import LedgerKind, ledger_kind_check, ledger_kind_compose
from integrations.services.dispatch.deliveries import (
    DELETION_REQUESTS,
    RESOLUTION_REQUESTS,
    SAAS_DELETIONS,
)
from integrations.services.dispatch.delivery_loop import DeliveryKind
from integrations.services.staff.staff import ROLE_GROUP, STAFF_USER

SQL_DIR = Path(settings.BASE_DIR) / "integrations" / "sql"
MIGRATIONS_DIR = Path(settings.BASE_DIR) / "integrations" / "migrations"

# A call of the SQL writer, up to its third argument (the kind).
_SQL_APPEND = re.compile(r"\bdropportal_ledger_append\(\s*[^,]+,\s*[^,]+,\s*([^,]+),")


def _sql_kinds() -> dict[str, list[str]]:
    """Each SQL file's kind arguments to dropportal_ledger_append, as written."""
    found: dict[str, list[str]] = {}
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        # Its definition names the parameter (p_kind text), not a kind.
        text = re.sub(r"CREATE OR REPLACE FUNCTION dropportal_ledger_append\(", "", text)
        kinds = [m.group(1).strip() for m in _SQL_APPEND.finditer(text)]
        if kinds:
            found[path.name] = kinds
    return found


def test_every_kind_the_sql_functions_write_is_registered() -> None:
    found = _sql_kinds()
    assert found, "no call of dropportal_ledger_append found in integrations/sql/"
    for name, kinds in found.items():
        for written in kinds:
            literal = re.fullmatch(r"'([a-z_]+\.[a-z_]+)'", written)
            assert literal, f"{name}: a kind is written as a literal, not {written}"
            assert literal.group(1) in set(LedgerKind), (
                f"{name} writes {literal.group(1)!r}, which LedgerKind does not register"
            )


def test_every_kind_the_sql_reads_is_registered() -> None:
    # A kind misspelt where the ledger is read matches no event, silently: in a SQL function,
    # or in a migration's SQL (0056's backfill reads two). (A dotted name: a plain word
    # compared with a "kind" is some other column's.)
    compared = re.compile(r"\bkind\s*(?:=\s*'[^']*'|IN\s*\([^)]*\))", re.IGNORECASE)
    dotted = re.compile(r"'([a-z_]+\.[a-z_]+)'")
    paths = [*sorted(SQL_DIR.glob("*.sql")), *sorted(MIGRATIONS_DIR.glob("*.py"))]
    read = {
        (path.name, literal)
        for path in paths
        for comparison in compared.findall(path.read_text(encoding="utf-8"))
        for literal in dotted.findall(comparison)
    }
    assert (
        "0056_redispatch_marked_on_the_request.py",
        "deletion_request.redelivery_requested",
    ) in read
    for name, literal in read:
        assert literal in set(LedgerKind), f"{name} reads {literal!r}, which LedgerKind lacks"


@pytest.mark.parametrize("deliverable", [DELETION_REQUESTS, RESOLUTION_REQUESTS, SAAS_DELETIONS])
@pytest.mark.parametrize("outcome", ["delivered", "delivery_failed", "undeliverable", "cancelled"])
def test_every_event_of_the_delivery_loop_is_registered(
    deliverable: DeliveryKind[Any], outcome: str
) -> None:
    assert ledger_kind_compose(deliverable.name, outcome) == f"{deliverable.name}.{outcome}"


@pytest.mark.parametrize("name", [STAFF_USER, ROLE_GROUP])
@pytest.mark.parametrize("verb", ["added", "changed", "deleted"])
def test_every_event_of_the_staff_admin_is_registered(name: str, verb: str) -> None:
    assert ledger_kind_compose(name, verb) == f"{name}.{verb}"


def test_a_kind_outside_the_registry_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown ledger kind 'alert\.snoozed'.*LedgerKind"):
        ledger_kind_compose("alert", "snoozed")
    with pytest.raises(ValueError, match=r"unknown ledger kind 'Broker\.Created'"):
        ledger_kind_check("Broker.Created")
    assert ledger_kind_check("broker.created") is LedgerKind.BROKER_CREATED


def test_members_are_named_after_their_stored_value() -> None:
    for member in LedgerKind:
        assert re.fullmatch(r"[a-z_]+\.[a-z_]+", member.value), member
        assert member.name == member.value.upper().replace(".", "_"), member
        assert len(member.value) <= 64  # LedgerEvent.kind's max_length


def test_the_registry_needs_no_django() -> None:
    # The offline evidence verifier reads kinds from it, without Django.
    code = (
        "import sys, integrations.ledger_kinds, integrations.evidence.verify; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, check=True)  # noqa: S603
