"""Databases made on the project's PostgreSQL server beside its own: the demo's, and the
tests' (each worker's copy of the migrated template, a test's database of its own)."""

from __future__ import annotations

from typing import Any


def database_recreate(cursor: Any, name: str, *, template: str | None = None) -> None:
    """Drop ``name`` (ending its sessions) and create it again: empty, or a copy of
    ``template``. ``cursor``: one in autocommit, on another database of the same server."""
    cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    cursor.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
