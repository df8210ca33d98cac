"""Compare versions of the callback path: what a change costs or buys, in paired rounds.

Each git revision given is exported to a scratch directory and served by its own gunicorn
(4 sync workers, the callbacks bench's settings), all on one scratch database; rounds of
``--callbacks`` signed deletion callbacks (``bench_callbacks.py``'s requests, its wrk load)
go to each in turn, the order rotated every cycle. Each revision's rate is divided by the
first revision's in the same cycle; the median over ``--cycles`` is reported, with the web
workers' and this database's PostgreSQL CPU per callback (medians, from ``/proc``). Not run
by ``make bench`` (it needs wrk and git); used for the table of shortcuts in
docs/benchmarks.md::

    DATABASE_URL=postgres://... python bench/compare_callbacks.py HEAD~1 HEAD [--cycles 7]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench_callbacks import (
    ROOT,
    WRK,
    CallbackWorld,
    _processes,
    _wait_for_server,
    free_port,
    load_wrk,
    serve,
)
from scratch_db import admin_execute, scratch_names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("revisions", nargs="+", help="git revisions; the first is the reference")
    parser.add_argument("--cycles", type=int, default=7)
    parser.add_argument("--callbacks", type=int, default=1500)
    args = parser.parse_args()
    if len(set(args.revisions)) != len(args.revisions):
        parser.error("give each revision once (HEAD and HEAD~0 name the same code twice)")
    base_url = os.environ.get("DATABASE_URL")
    if not base_url or WRK is None:
        print("set DATABASE_URL and install wrk")
        return 2
    admin_url, name = scratch_names(base_url, "bench_callbacks")
    name += "_compare"
    os.environ["DATABASE_URL"] = urlunsplit(urlsplit(base_url)._replace(path=f"/{name}"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    servers: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    with tempfile.TemporaryDirectory(prefix="compare_callbacks_") as scratch:
        try:
            import django

            django.setup()
            from django.core.management import call_command

            call_command("migrate", verbosity=0)
            for revision in args.revisions:
                root = Path(scratch) / str(len(servers))
                root.mkdir()
                archive = subprocess.run(  # noqa: S603
                    ["git", "archive", revision],  # noqa: S607
                    cwd=ROOT,
                    capture_output=True,
                    check=True,
                ).stdout
                subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)  # noqa: S603, S607
                port = free_port()
                servers[revision] = (port, serve(root, port, workers=4))
            result = _compare(args, servers)
        finally:
            for _, server in servers.values():
                server.terminate()
                server.wait(timeout=30)
            from django.db import connections

            connections.close_all()
            admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(result))
    return 0


def _compare(
    args: argparse.Namespace, servers: dict[str, tuple[int, subprocess.Popen[bytes]]]
) -> dict[str, Any]:
    from django.db import connection

    world = CallbackWorld()

    def cpu(server_pid: int) -> tuple[dict[int, float], dict[int, float]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            backends = {pid for (pid,) in cursor.fetchall()}
        processes = _processes()
        return (
            {pid: s for pid, (_, parent, s) in processes.items() if parent == server_pid},
            {pid: s for pid, (_, _, s) in processes.items() if pid in backends},
        )

    def round_of(revision: str, count: int) -> tuple[float, float, float]:
        port, server = servers[revision]
        rows = world.dispatched(count)
        requests = world.signed_callbacks(port, rows)
        before = cpu(server.pid)
        elapsed, statuses = load_wrk(port, requests, 16)
        after = cpu(server.pid)
        web, postgres = (
            sum(s - then.get(pid, 0.0) for pid, s in now.items()) / count * 1000
            for then, now in zip(before, after, strict=True)
        )
        world.check_recorded(revision, rows, statuses)
        return count / elapsed, web, postgres

    revisions = list(servers)
    for revision in revisions:
        _wait_for_server(servers[revision][0], world.key)
        round_of(revision, 300)  # warm every worker
    rounds: dict[str, list[tuple[float, float, float]]] = {r: [] for r in revisions}
    for number in range(args.cycles):
        shift = number % len(revisions)
        for revision in revisions[shift:] + revisions[:shift]:
            rounds[revision].append(round_of(revision, args.callbacks))
        print(number, {r: round(rounds[r][-1][0]) for r in revisions}, file=sys.stderr)
    reference = [rate for rate, _, _ in rounds[revisions[0]]]
    return {
        revision: {
            "ratio_to_first": round(
                statistics.median(
                    rate / ref for (rate, _, _), ref in zip(measured, reference, strict=True)
                ),
                3,
            ),
            "rates": [round(rate) for rate, _, _ in measured],
            "web_cpu_ms": round(statistics.median(web for _, web, _ in measured), 3),
            "postgres_cpu_ms": round(statistics.median(pg for _, _, pg in measured), 3),
        }
        for revision, measured in rounds.items()
    }


if __name__ == "__main__":
    sys.exit(main())
