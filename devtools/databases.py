"""Databases made on the project's PostgreSQL server beside its own: the demo's, and the
tests' (each worker's copy of the migrated template, a test's database of its own)."""

from __future__ import annotations

from typing import Any


def demo_database_name(name: str) -> str:
    """The demo's database beside the database ``name``."""
    return f"{name}_demo"


def database_drop(cursor: Any, name: str) -> None:
    """Drop ``name`` if it is there, ending its sessions. ``cursor``: one in autocommit, on
    another database of the same server."""
    cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_recreate(cursor: Any, name: str, *, template: str | None = None) -> None:
    """Drop ``name`` (ending its sessions) and create it again: empty, or a copy of
    ``template``. ``cursor``: one in autocommit, on another database of the same server."""
    database_drop(cursor, name)
    cursor.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
