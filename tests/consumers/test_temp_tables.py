"""Each temp table of the consumer import is read only by the module that creates it.

Each merge path stages the rounds ``consumers/load.py`` hands it in its own tables, and
fills a fresh partition from them itself. The late match (``services/cycle/matching.py``)
makes its own table of the hashes a call added; the merge only inserts into it.

Three checks: by name in the sources; by exported constant (a temp table's name handed
on as a public constant is how a relation leaked before: the reader composed it in, so
the name never appeared in its text); and, the one that sees composed names, by the
statements the import runs, each attributed to the module that executed it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from psycopg import sql

from devtools.drop_simulator import work_items
from integrations.consumers.sources import ConsumerSource, consumer_sources
from integrations.models import Broker, DeletionRequest
from integrations.services.cycle.consumers import consumers_import, consumers_replace
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.staff.brokers import broker_create
from tests.builders import WebhookIntegrationFactory, drop_zip, write_zip

INTEGRATIONS = Path(settings.BASE_DIR) / "integrations"
CREATED = re.compile(
    r"CREATE TEMP(?:ORARY)? (?:TABLE|SEQUENCE|VIEW) (?:IF NOT EXISTS )?\"?([a-z_0-9]+)\b"
)


def import_module(module: str) -> bool:
    """A module of the consumer import, late match included."""
    return module.startswith("consumers/") or module in {
        "services/cycle/consumers.py",
        "services/cycle/matching.py",
    }


def modules() -> dict[str, str]:
    return {
        path.relative_to(INTEGRATIONS).as_posix(): path.read_text(encoding="utf-8")
        for path in INTEGRATIONS.rglob("*.py")
        if "migrations" not in path.parts
    }


def import_temp_tables(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each temp table a module of the import creates, with the modules that create it."""
    creators: dict[str, set[str]] = {}
    for module, text in sources.items():
        for name in CREATED.findall(text):
            creators.setdefault(name, set()).add(module)
    return {name: made for name, made in creators.items() if any(map(import_module, made))}


def test_each_import_temp_table_is_named_only_where_it_is_created() -> None:
    sources = modules()
    tables = import_temp_tables(sources)
    # The pattern finds them, one module each.
    assert tables["consumer_registration_staging"] == {"consumers/merge_general.py"}
    assert tables["late_match_added"] == {"services/cycle/matching.py"}
    assert all(len(made) == 1 for made in tables.values()), tables

    strays = {}
    for name, made in tables.items():
        naming = {m for m, text in sources.items() if re.search(rf"\b{name}\b", text)}
        if naming - made:
            strays[name] = sorted(naming - made)
    assert strays == {}


def _constant_names(node: ast.expr) -> list[str]:
    """The table name a constant holds: a string, or ``sql.Identifier("...")``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Identifier":
        return [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
    return []


def test_no_module_exports_the_name_of_an_import_temp_table() -> None:
    """A public constant naming a temp table is a way to read it from elsewhere."""
    sources = modules()
    tables = import_temp_tables(sources)
    exported = []
    for module, text in sources.items():
        for node in ast.parse(text).body:
            target, value = None, None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if not isinstance(target, ast.Name) or target.id.startswith("_") or value is None:
                continue
            exported += [
                f"{module}: {target.id}" for name in _constant_names(value) if name in tables
            ]
    assert exported == []


# ---------------------------------------------------------------- the statements run


# Runs the statement its caller writes: ``work_items_lock`` wraps the caller's own
# subquery (a constant, over the caller's temp table) in the lock order. Such a statement
# is the caller's.
RUNS_CALLERS_SQL = {"services/locks.py"}


def _executing_module() -> str | None:
    """The module of the app that executes the statement (the nearest frame of it)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(INTEGRATIONS):
            module = path.relative_to(INTEGRATIONS).as_posix()
            if module not in RUNS_CALLERS_SQL:
                return module
        frame = frame.f_back  # type: ignore[assignment]
    return None


@contextmanager
def statements_recorded() -> Iterator[list[tuple[str, str]]]:
    """(module, statement) for each statement a module of the app executes."""
    recorded: list[tuple[str, str]] = []

    def record(execute: Callable[..., Any], statement: Any, *args: Any) -> Any:
        module = _executing_module()
        if module is not None:
            text = statement
            if isinstance(statement, sql.Composable):
                text = statement.as_string(args[-1]["connection"].connection)
            recorded.append((module, str(text)))
        return execute(statement, *args)

    with connection.execute_wrapper(record):
        yield recorded


def reads_elsewhere(recorded: list[tuple[str, str]]) -> tuple[dict[str, set[str]], set[str]]:
    """Each import temp table named by a statement of another module than its creator's,
    but as the target of an INSERT; and every import temp table created."""
    creators: dict[str, set[str]] = {}
    for module, text in recorded:
        for name in CREATED.findall(text):
            creators.setdefault(name, set()).add(module)
    tables = {name: made for name, made in creators.items() if any(map(import_module, made))}
    reads: dict[str, set[str]] = {}
    for module, text in recorded:
        for name, made in tables.items():
            if module in made:
                continue
            rest = re.sub(rf'INSERT\s+INTO\s+"?{name}"?(?!\w)', "", text, flags=re.IGNORECASE)
            if re.search(rf"(?<!\w){name}(?!\w)", rest):
                reads.setdefault(name, set()).add(module)
    return reads, set(tables)


ITEMS = list(work_items(4))
OTHERS = [digest for _, digest in work_items(3, start=1000)]  # hashes DROP did not send


def csv_files(tmp_path: Path, name: str, rows: list[tuple[str, str, str]]) -> list[ConsumerSource]:
    path = tmp_path / f"{name}.csv"
    lines = "".join(f"{pointer},{kind},{digest}\n" for pointer, kind, digest in rows)
    path.write_text("remote_identifier,hash_type,hash\n" + lines, encoding="utf-8")
    return consumer_sources(str(path)).files


@pytest.mark.django_db
def test_no_import_temp_table_is_read_by_a_module_that_did_not_create_it(
    broker: Broker, tmp_path: Path
) -> None:
    """Every merge path and both late matches: a first set in key order (streamed) and
    out of it (staged), a later import, a replace."""
    WebhookIntegrationFactory.create(broker=broker)
    package = drop_zip(broker, {"Email": [ITEMS[0], ITEMS[1]], "Phone": [ITEMS[2], ITEMS[3]]})
    drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test")
    other = broker_create(broker_id="4822", name="Other", mode="test", actor="test")
    kw: dict[str, Any] = {"hashed": True, "actor": "test", "source": "file:test"}

    with statements_recorded() as recorded:  # strict or not, every row is valid
        first = [("C-1", "email", ITEMS[0][1]), ("C-2", "email", OTHERS[0])]
        consumers_import(broker=broker, files=csv_files(tmp_path, "first", first), **kw)
        later = [("C-4", "email", ITEMS[1][1]), ("C-3", "phone", ITEMS[3][1])]
        consumers_import(broker=broker, files=csv_files(tmp_path, "later", later), **kw)
        consumers_replace(
            broker=broker, files=csv_files(tmp_path, "all", first + later), force=True, **kw
        )
        unsorted = [("C-9", "email", OTHERS[1]), ("C-1", "email", OTHERS[2])]
        consumers_import(broker=other, files=csv_files(tmp_path, "other", unsorted), **kw)

    assert DeletionRequest.objects.filter(late_match=True).count() == 3  # each late match ran
    reads, tables = reads_elsewhere(recorded)
    assert reads == {}
    assert tables >= {
        "consumer_registration_round_staging",  # merge_streamed
        "consumer_registration_staging",  # merge_general
        "consumer_registration_pointers",
        "consumer_registration_forgotten",  # the replace
        "late_match_added",  # the late match's list
        "drop_late_items",  # the late match's matched items
    }
