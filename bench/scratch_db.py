"""Scratch databases for the benches: each works in its own database, created next to
``DATABASE_URL``'s (the role needs the CREATEDB right) and dropped at the end, so a bench
never touches the database it was pointed at::

    admin_url, name = scratch_names(base_url, "bench_dispatch")
    admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = with_database(base_url, name)
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import psycopg


def scratch_names(base_url: str, stem: str) -> tuple[str, str]:
    """The server's maintenance database URL, and a scratch database name of this process."""
    parts = urlsplit(base_url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    name = f"{(parts.path.lstrip('/') or 'dropportal')}_{stem}_{os.getpid()}"
    return admin, name


def with_database(url: str, name: str) -> str:
    """``url`` naming the database ``name`` instead."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def admin_execute(admin_url: str, sql: str) -> None:
    """One statement outside a transaction (CREATE and DROP DATABASE need that)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql)
