"""The SQL functions a migrated database holds are today's source (``integrations/sql/``).

Each migration installs its own frozen copy, so a change to a file under ``integrations/sql/``
without a new migration (carrying a copy of it) leaves migrated databases on the old version:
these tests fail until that migration exists. The second one migrates a database holding data
at the first migration up to the newest, as an old installation upgrades.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from integrations.services.ledger import canonical_data, event_hash
from integrations.services.staff.keys import key_digest
from tests.conftest import database_of_its_own, subprocess_env

SQL_DIR = Path(settings.BASE_DIR) / "integrations" / "sql"

# Every dropportal_* function of the current schema: signature -> full definition.
_DEFINITIONS = """
SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND p.proname LIKE 'dropportal\\_%'
ORDER BY 1
"""

# And every trigger of ours (the source files create some with CREATE OR REPLACE TRIGGER):
# "trigger <name> on <table>" -> its definition.
_TRIGGERS = """
SELECT 'trigger ' || t.tgname || ' on ' || c.relname, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND NOT t.tgisinternal
ORDER BY 1
"""


def _definitions(cursor: Any) -> dict[str, str]:
    cursor.execute(_DEFINITIONS)
    functions = dict(cursor.fetchall())
    cursor.execute(_TRIGGERS)
    return {**functions, **dict(cursor.fetchall())}


def _installed_and_source(cursor: Any) -> tuple[dict[str, str], dict[str, str]]:
    """The definitions installed, then those after running today's source files over them
    (the caller rolls back)."""
    installed = _definitions(cursor)
    for path in sorted(SQL_DIR.glob("*.sql")):
        cursor.execute(path.read_text(encoding="utf-8"))
    return installed, _definitions(cursor)


def test_migrated_functions_are_todays_source(db: None) -> None:
    with connection.cursor() as cursor:
        installed, source = _installed_and_source(cursor)
    # The test's transaction is rolled back: the database keeps what the migrations installed.
    assert set(installed) >= {
        "dropportal_api_key_lookup(text,text,text)",
        "dropportal_ledger_append(timestamp with time zone,text,text,text,text,text)",
        "trigger integrations_workitem_outstanding_updated on integrations_workitem",
    }
    changed = sorted(name for name in source if installed.get(name) != source[name])
    assert not changed, (
        f"{changed} differ from integrations/sql/: add a migration that installs a copy "
        "of the changed files (integrations/migrations/sql/NNNN/)"
    )


def test_no_function_is_left_behind_as_an_overload(db: None) -> None:
    # A migration that changes a signature drops the old function: CREATE OR REPLACE alone
    # would keep it, callable, beside the new one.
    with connection.cursor() as cursor:
        cursor.execute(_DEFINITIONS)
        names = [signature.split("(")[0] for signature, _ in cursor.fetchall()]
    assert sorted(names) == sorted(set(names))


def test_the_status_rule_is_inlined_where_it_is_read(db: None) -> None:
    # A function scan would mean the planner calls it, planning its body anew each time: per
    # settlement, and per row of the bulk updates that read it.
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (FORMAT JSON) SELECT f.state, f.needs_amendment"
            " FROM integrations_workitem w, dropportal_work_item_status_fields("
            "   w.state, w.status_code, w.reported_at, w.reported_status_code,"
            "   w.needs_amendment) f"
        )
        plan = str(cursor.fetchone()[0])
    assert "integrations_workitem" in plan
    assert "Function Scan" not in plan, plan


# One process does the upgrade's steps, in order: the first migration, the newest, then the
# ledger's verification (a process for each would start Django anew, a second of CPU each).
# Between the migrations it waits for a line on stdin while the test writes the first
# version's rows. The system checks are not what is tested here (the suite runs them).
_AT_THE_FIRST_MIGRATION = "at the first migration"
_UPGRADE = f"""
import sys
from django.core.management import call_command

call_command("migrate", "integrations", "0001", verbosity=0, skip_checks=True)
print({_AT_THE_FIRST_MIGRATION!r}, flush=True)
sys.stdin.readline()
call_command("migrate", verbosity=0, skip_checks=True)
call_command("ledger", "verify")
"""


@pytest.fixture
def scratch_database(db: None) -> Iterator[str]:
    """An empty database of its own on the test server, dropped afterwards."""
    with database_of_its_own("upgrade") as url:
        yield url


@pytest.mark.slow
def test_a_database_from_the_first_migration_upgrades_with_its_data(
    scratch_database: str, tmp_path: Path
) -> None:
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        upgrade = subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", "shell", "--no-imports", "-c", _UPGRADE],
            cwd=settings.BASE_DIR,
            env=subprocess_env(DATABASE_URL=scratch_database),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert upgrade.stdin is not None and upgrade.stdout is not None
        for line in upgrade.stdout:
            if line.strip() == _AT_THE_FIRST_MIGRATION:
                break
        else:
            upgrade.wait(timeout=60)
            pytest.fail(f"the first migration failed:\n{errors.read_text()}")
        _first_version_rows(scratch_database)
        upgrade.stdin.close()  # on to the newest migration
        upgrade.stdout.read()
        upgrade.wait(timeout=60)
    finally:
        if upgrade.poll() is None:
            upgrade.kill()
            upgrade.wait()
    # ledger verify over the upgraded database: the old event seals and verifies.
    assert upgrade.returncode == 0, errors.read_text()

    with psycopg.connect(scratch_database) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT broker_id, name, mode FROM integrations_broker")
        assert cursor.fetchall() == [("4821", "Acme Data", "test")]
        # The old key is found by today's lookup, with its broker.
        cursor.execute(
            "SELECT key_prefix, broker_id FROM dropportal_api_key_lookup(%s, NULL, NULL)",
            [key_digest(_OLD_KEY)],
        )
        assert cursor.fetchall() == [("dp_upgr", "4821")]
        installed, source = _installed_and_source(cursor)
        conn.rollback()
    assert installed == source


_OLD_KEY = "dp_upgrade_test_key"


def _first_version_rows(url: str) -> None:
    """A broker, its key and a ledger event, as the first version wrote them: the hash
    computed in Python, no SQL function yet."""
    created = dt.datetime(2026, 1, 5, 9, 30, tzinfo=dt.UTC)
    event: dict[str, Any] = {
        "created_at": created,
        "broker_id": "4821",
        "kind": "broker.created",
        "subject": "4821",
        "actor": "cli:ops",
        "data": {"name": "Acme Data"},
    }
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO integrations_broker (broker_id, name, mode, drop_api_key, "
            "drop_base_url, created_at, updated_at) "
            "VALUES ('4821', 'Acme Data', 'test', '', '', now(), now())"
        )
        conn.execute(
            "INSERT INTO integrations_apikey (name, prefix, digest, scopes, created_at, "
            "broker_id) SELECT 'old', 'dp_upgr', %s, ARRAY['ingest'], now(), id "
            "FROM integrations_broker",
            [key_digest(_OLD_KEY)],
        )
        conn.execute(
            "INSERT INTO integrations_ledgerevent (created_at, broker_id, kind, subject, "
            "actor, data, event_hash) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s)",
            [
                created,
                "4821",
                "broker.created",
                "4821",
                "cli:ops",
                canonical_data(event["data"]),
                event_hash(**event),
            ],
        )
