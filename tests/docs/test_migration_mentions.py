"""Where the code and the docs name a migration by its number, that migration does the thing.

Each mention is found by the words around it and checked against what the migration's file
holds, so a renumbering or a wrong number is caught. Pure file checks; no database.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "integrations" / "migrations"

# (file, the mention with its number as the group, what that migration's file must hold)
MENTIONS = [
    ("SECURITY.md", r"groups from migration (\d{4})", "create_roles"),
    ("SECURITY.md", r"Before migration (\d{4}) django-otp kept them in clear", "otp_totp"),
    ("docs/operations.md", r"Factors enrolled before migration (\d{4})", "otp_totp"),
    ("docs/operations.md", r"which migration (\d{4}) emptied", "sessions_moved_in"),
    ("SECURITY.md", r"changes only by a migration, such\s+as (\d{4})", "permissions"),
    ("docs/operations.md", r"created by migration\s+(\d{4}) from permissions", "create_roles"),
    ("docs/operations.md", r"\((\d{4}) gave Auditors", "export_audit_records"),
    ("docs/operations.md", r"triggers from migration (\d{4})", "CREATE TRIGGER"),
    ("SECURITY.md", r"never by whoever wrote it, migration (\d{4})", "approve_reportfile"),
    ("SECURITY.md", r"`approve_reportfile`, migration (\d{4})", "approve_reportfile"),
    ("docs/operations.md", r"never one they wrote \(migration (\d{4})\)", "approve_reportfile"),
    (
        "integrations/admin/audit.py",
        r"Held by Auditors \(migration (\d{4})\)",
        "export_audit_records",
    ),
    ("tests/admin/test_roles.py", r"audit keys \(migration (\d{4})\)", "add_audit_apikey"),
    ("docs/benchmarks.md", r"upload's time since migration (\d{4})", "pending_status_code"),
    ("integrations/services/staff/staff_mfa.py", r"emptied by migration (\d{4})", "otp_totp"),
    (
        "integrations/consumers/load.py",
        r"broker \(migration (\d{4})\)",
        "PARTITION BY LIST",
    ),
    (
        "integrations/models/consumers.py",
        r"partition of their own \(migration (\d{4})\)",
        "PARTITION",
    ),
    ("docs/scaling.md", r"What is built \(migration (\d{4})", "PARTITION BY LIST"),
    (
        "integrations/models/drop.py",
        r"an amendment DROP rejected, from before migration (\d{4})",
        "pending_status_code",
    ),
    (
        "docs/architecture.md",
        r"\(`0024_\*\.py`, `(\d{4})_\*\.py`\)",
        "DROP FUNCTION dropportal_work_item_status_fields",
    ),
    (
        "docs/benchmarks.md",
        r"What changed \(migration (\d{4}), `consumers/load",
        "PARTITION BY LIST",
    ),
    ("SECURITY.md", r"masked again by migration (\d{4})", "def free_text_masked_again"),
]


def _migration_text(number: str) -> str:
    (path,) = MIGRATIONS.glob(f"{number}_*.py")
    return path.read_text()


@pytest.mark.parametrize(("name", "mention", "holds"), MENTIONS)
def test_a_migration_named_by_number_is_the_one_that_does_it(
    name: str, mention: str, holds: str
) -> None:
    text = (ROOT / name).read_text()
    numbers = re.findall(mention, text)
    assert numbers, f"{name} no longer says {mention!r}: update this list"
    for number in numbers:
        assert holds in _migration_text(number), f"{name}: migration {number} has no {holds!r}"
