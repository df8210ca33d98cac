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
import datetime as dt
import json
import os
import statistics
import subprocess
import tempfile
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench_callbacks import (
    DELETION_PATH,
    ROOT,
    WRK,
    _processes,
    _wait_for_server,
    admin_execute,
    free_port,
    load_wrk,
    raw_put,
    scratch_urls,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("revisions", nargs="+", help="git revisions; the first is the reference")
    parser.add_argument("--cycles", type=int, default=7)
    parser.add_argument("--callbacks", type=int, default=1500)
    args = parser.parse_args()
    base_url = os.environ.get("DATABASE_URL")
    if not base_url or WRK is None:
        print("set DATABASE_URL and install wrk")
        return 2
    admin_url, name = scratch_urls(base_url)
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
                servers[revision] = (port, _serve(root, port))
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


def _serve(root: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603
        [
            *(sys.executable, "-m", "gunicorn", "dropportal.wsgi", "--bind", f"127.0.0.1:{port}"),
            *("--workers", "4", "--backlog", "2048", "--log-level", "warning"),
        ],
        cwd=root,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "callbacks_settings",
            "PYTHONPATH": f"{root / 'bench'}{os.pathsep}{root}",
            "DROPPORTAL_CALLBACK_RATE_LIMIT": "1000000",
        },
    )


def _compare(
    args: argparse.Namespace, servers: dict[str, tuple[int, subprocess.Popen[bytes]]]
) -> dict[str, Any]:
    from django.db import connection
    from django.utils import timezone

    from integrations.dispatch import signing
    from integrations.models import (
        DeletionRequest,
        DropCycle,
        Integration,
        IntegrationKind,
        RequestState,
        WorkItem,
    )
    from integrations.services.brokers import broker_create
    from integrations.services.keys import api_key_create

    broker = broker_create(broker_id="4821", name="Bench", actor="bench")
    secret = signing.generate_webhook_secret()
    integration = Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.WEBHOOK,
        name="Bench",
        url="https://broker.example/hook",
        webhook_secret=secret,
    )
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="bench").key
    today = timezone.localdate()
    cycle = DropCycle.objects.create(
        broker=broker,
        drop_session_id="1",
        zip_name="bench.zip",
        zip_sha256="0" * 64,
        downloaded_at=timezone.now(),
        match_date=today,
        due_date=today + dt.timedelta(days=45),
    )
    serial = iter(range(10**9))

    def dispatched(count: int) -> list[DeletionRequest]:
        items = WorkItem.objects.bulk_create(
            WorkItem(
                broker=broker,
                cycle=cycle,
                work_item_id=f"B{next(serial):011d}",
                hash_type="email",
                hash=os.urandom(32),
                file_name="bench_Email.csv",
            )
            for _ in range(count)
        )
        return DeletionRequest.objects.bulk_create(
            DeletionRequest(
                state=RequestState.DISPATCHED,
                dispatched_at=timezone.now(),
                broker=broker,
                work_item=item,
                integration=integration,
                identifier_hash="KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=",
                hash_type="email",
                drop_session_id="1",
                match_date=today,
                broker_id_code="4821",
                mode="test",
            )
            for item in items
        )

    def requests_for(port: int, rows: list[DeletionRequest]) -> list[bytes]:
        prepared = []
        for row in rows:
            body = json.dumps(
                {
                    "schema_version": "1.0",
                    "status": "completed",
                    "request_uuid": str(row.request_uuid),
                    "drop_outcome": "deleted",
                },
                separators=(",", ":"),
            ).encode()
            headers = {
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/json",
                **signing.signed_headers(secret, body),
            }
            prepared.append(raw_put(port, DELETION_PATH, body, headers))
        return prepared

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
        rows = dispatched(count)
        requests = requests_for(port, rows)
        before = cpu(server.pid)
        elapsed, statuses = load_wrk(port, requests, 16)
        after = cpu(server.pid)
        web, postgres = (
            sum(s - then.get(pid, 0.0) for pid, s in now.items()) / count * 1000
            for then, now in zip(before, after, strict=True)
        )
        recorded = DeletionRequest.objects.filter(
            pk__in=[r.pk for r in rows], state=RequestState.COMPLETED
        ).count()
        if statuses != {200: count} or recorded != count:
            raise SystemExit(f"{revision}: answers {dict(statuses)}, {recorded} recorded")
        return count / elapsed, web, postgres

    revisions = list(servers)
    for revision in revisions:
        _wait_for_server(servers[revision][0], key)
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
