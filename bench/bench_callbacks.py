"""Benchmark: broker callbacks recorded per second through gunicorn.

``PUT /api/v1/drop/callbacks/deletion`` as a broker sends it (bearer key, signed body §2.2,
``deleted``), each for its own dispatched deletion request, so every one is recorded: key
lookup, request lookup, signature and timestamp check, validation, the outcome UPDATE with
its ledger event, and the work item's settlement, in one transaction.

Baseline, same server, same run: a bare DRF view (``bench/callbacks_urls.py``) that does only
the minimum durable work: parse the JSON, one UPDATE and one INSERT in a transaction (in SQL).
The same view written with the ORM is measured too, for information.

Target: at least 70 % of the bare view's rate. ``--repeats`` rounds of each, alternating,
with fresh rows each round; the ratio is the median of the rounds' ratios, each ours against
the bare round just before it (the machine's speed drifts between rounds: best-of-each could
pair a fast round of one with a slow round of the other). The best rates are reported too.
The load comes from ``wrk`` when it is installed (``bench/callbacks_wrk.lua``: one thread per
connection, each sending its share of the prepared requests once), otherwise from
``--clients`` Python processes with ``--threads`` threads each; ``--clients`` x ``--threads``
connections at a time either way (gunicorn's sync workers close every connection, so each
callback is a new one, for both views alike). The JSON names the load used.

Everything happens in a scratch database created next to ``DATABASE_URL``'s (it needs the
CREATEDB right) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_callbacks.py [--callbacks 1500] [--repeats 7]

Prints one line of JSON last; exits 1 when the target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import datetime as dt
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from scratch_db import admin_execute, scratch_names

RATIO_TARGET = 0.7
WRK = shutil.which("wrk")
ROOT = Path(__file__).resolve().parents[1]
DELETION_PATH = "/api/v1/drop/callbacks/deletion"
BARE_PATH = "/bench/bare-callback"
BARE_ORM_PATH = "/bench/bare-orm-callback"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the load: raw HTTP/1.1 over a new connection per request ---------------------------------


def _send(port: int, raw: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(raw)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
    return int(received[9:12])


def client_process(port: int, requests: list[bytes], threads: int, go: Any, out: Any) -> None:
    go.wait()
    with ThreadPoolExecutor(threads) as pool:
        statuses = Counter(pool.map(lambda raw: _send(port, raw), requests))
    out.send((time.monotonic(), dict(statuses)))


def load(
    port: int, requests: list[bytes], clients: int, threads: int
) -> tuple[float, Counter[int]]:
    context = multiprocessing.get_context("fork")
    go = context.Event()
    pipes, processes = [], []
    for i in range(clients):
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=client_process, args=(port, requests[i::clients], threads, go, child_end)
        )
        process.start()
        pipes.append(parent_end)
        processes.append(process)
    time.sleep(0.5)  # every client ready before the clock starts
    started = time.monotonic()
    go.set()
    finished, statuses = started, Counter[int]()
    for pipe in pipes:
        at, counts = pipe.recv()
        finished = max(finished, at)
        statuses.update(counts)
    for process in processes:
        process.join()
    return finished - started, statuses


def load_wrk(port: int, requests: list[bytes], connections: int) -> tuple[float, Counter[int]]:
    """The same load through wrk: one thread per connection, each sending its share once.
    Timed from the first request sent to the last answer received, by the threads' clocks
    (wrk's own duration is the fixed one it is given; it is stopped once every thread is
    done)."""
    with tempfile.TemporaryDirectory(prefix="bench_callbacks_") as scratch:
        prefix = os.path.join(scratch, "requests")
        for thread in range(connections):
            with open(f"{prefix}.{thread}", "wb") as out:
                out.write(b"\0".join(requests[thread::connections]))
        wrk = subprocess.Popen(  # noqa: S603
            [
                WRK,
                f"--threads={connections}",
                f"--connections={connections}",
                "--duration=600s",
                "--timeout=30s",
                f"--script={ROOT / 'bench' / 'callbacks_wrk.lua'}",
                f"http://127.0.0.1:{port}/",
                "--",
                prefix,
            ],
            stdout=subprocess.DEVNULL,
        )
        done = [f"{prefix}.{thread}.done" for thread in range(connections)]
        try:
            while not all(os.path.exists(path) for path in done):
                if wrk.poll() is not None:
                    raise SystemExit(f"wrk ended early (exit {wrk.returncode})")
                time.sleep(0.005)
            time.sleep(0.01)  # each file is written whole before the thread stops
        finally:
            wrk.send_signal(signal.SIGINT)
            wrk.wait(timeout=30)
        starts, ends, statuses = [], [], Counter[int]()
        for path in done:
            with open(path, encoding="ascii") as file:
                first, last, *counts = file.read().split()
            starts.append(float(first))
            ends.append(float(last))
            for count in counts:
                status, number = count.split(":")
                statuses[int(status)] += int(number)
    return max(ends) - min(starts), statuses


# -- where the CPU goes: the web workers' and PostgreSQL's, read from /proc around each round --


def _processes() -> dict[int, tuple[str, int, float]]:
    """Every process's command, parent pid and CPU seconds so far, by pid, from one read of
    its ``/proc/<pid>/stat`` (none where there is no /proc)."""
    found = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                text = stat.read()
        except OSError:
            continue  # ended meanwhile
        command = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 1 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        found[int(entry)] = (command, int(fields[1]), cpu)
    return found


def cpu_snapshot(server_pid: int) -> dict[str, dict[int, float]]:
    """CPU seconds so far of each web worker and of each of this machine's PostgreSQL
    processes (none if the server is remote)."""
    processes = _processes()
    return {
        "web": {pid: cpu for pid, (_, parent, cpu) in processes.items() if parent == server_pid},
        "postgres": {pid: cpu for pid, (cmd, _, cpu) in processes.items() if cmd == "postgres"},
    }


def cpu_used(
    before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
) -> dict[str, float]:
    """Seconds used in between, per part: a process that started in between counts whole;
    one that ended in between (a recycled database connection) is lost, not negative."""
    return {
        part: sum(seconds - before[part].get(pid, 0.0) for pid, seconds in after[part].items())
        for part in after
    }


def raw_put(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"PUT {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode("ascii") + body


def serve(root: Path, port: int, *, workers: int) -> subprocess.Popen[bytes]:
    """gunicorn serving the code under ``root`` with the bench's settings (the bare views)."""
    return subprocess.Popen(  # noqa: S603
        [
            *(sys.executable, "-m", "gunicorn", "dropportal.wsgi", "--bind", f"127.0.0.1:{port}"),
            *("--workers", str(workers), "--backlog", "2048", "--log-level", "warning"),
        ],
        cwd=root,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "callbacks_settings",
            "PYTHONPATH": f"{root / 'bench'}{os.pathsep}{root}",
            # The limiter runs, at a rate the bench never reaches.
            "DROPPORTAL_CALLBACK_RATE_LIMIT": "1000000",
        },
    )


class CallbackWorld:
    """A broker with a webhook integration and a callback key, and dispatched deletion
    requests on demand, each answered by one signed ``deleted`` callback."""

    def __init__(self) -> None:
        from django.utils import timezone

        from integrations.dispatch import signing
        from integrations.models import DropCycle, Integration, IntegrationKind
        from integrations.services.staff.brokers import broker_create
        from integrations.services.staff.keys import api_key_create

        self.broker = broker_create(broker_id="4821", name="Bench", actor="bench")
        self.secret = signing.generate_webhook_secret()
        self.integration = Integration.objects.create(
            broker=self.broker,
            kind=IntegrationKind.WEBHOOK,
            name="Bench",
            url="https://broker.example/hook",
            webhook_secret=self.secret,
        )
        self.key = api_key_create(
            broker=self.broker, scopes=["webhook_callback"], actor="bench"
        ).key
        self.today = timezone.localdate()
        self.cycle = DropCycle.objects.create(
            broker=self.broker,
            drop_session_id="1",
            zip_name="bench.zip",
            zip_sha256="0" * 64,
            downloaded_at=timezone.now(),
            match_date=self.today,
            due_date=self.today + dt.timedelta(days=45),
        )
        self._serial = iter(range(10**9))

    def dispatched(self, count: int) -> list[Any]:
        """``count`` new deletion requests, dispatched and waiting for their callback."""
        from django.utils import timezone

        from integrations.models import DeletionRequest, RequestState, WorkItem

        items = WorkItem.objects.bulk_create(
            WorkItem(
                broker=self.broker,
                cycle=self.cycle,
                work_item_id=f"B{next(self._serial):011d}",
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
                broker=self.broker,
                work_item=item,
                integration=self.integration,
                identifier_hash="KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=",
                hash_type="email",
                drop_session_id="1",
                match_date=self.today,
                broker_id_code="4821",
                mode="test",
            )
            for item in items
        )

    @staticmethod
    def bodies(rows: list[Any]) -> list[bytes]:
        return [
            json.dumps(
                {
                    "schema_version": "1.0",
                    "status": "completed",
                    "request_uuid": str(row.request_uuid),
                    "drop_outcome": "deleted",
                },
                separators=(",", ":"),
            ).encode()
            for row in rows
        ]

    def signed_callbacks(self, port: int, rows: list[Any]) -> list[bytes]:
        """The raw requests a broker would send for ``rows``, signed and with the key."""
        from integrations.dispatch import signing

        return [
            raw_put(
                port,
                DELETION_PATH,
                body,
                {
                    "Authorization": f"Bearer {self.key}",
                    "Content-Type": "application/json",
                    **signing.signed_headers(self.secret, body),
                },
            )
            for body in self.bodies(rows)
        ]

    @staticmethod
    def check_recorded(label: str, rows: list[Any], statuses: Counter[int]) -> None:
        """Exit unless every one of ``rows`` was answered 200 and recorded."""
        from integrations.models import DeletionRequest, RequestState

        recorded = DeletionRequest.objects.filter(
            pk__in=[r.pk for r in rows], state=RequestState.COMPLETED
        ).count()
        if statuses != Counter({200: len(rows)}) or recorded != len(rows):
            raise SystemExit(f"{label}: answers {dict(statuses)}, {recorded} recorded")


# -- the bench --------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--callbacks", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--web-workers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument(
        "--python-load", action="store_true", help="the Python clients even if wrk is installed"
    )
    args = parser.parse_args()
    base_url = os.environ.get("DATABASE_URL")
    if not base_url:
        print("set DATABASE_URL (a server where a scratch database may be created)")
        return 2
    admin_url, name = scratch_names(base_url, "bench_callbacks")
    scratch_url = urlunsplit(urlsplit(base_url)._replace(path=f"/{name}"))
    admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = scratch_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    server: subprocess.Popen[bytes] | None = None
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        port = free_port()
        server = serve(ROOT, port, workers=args.web_workers)
        result = run(args, port, server.pid)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        from django.db import connections

        connections.close_all()
        admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


def run(args: argparse.Namespace, port: int, server_pid: int) -> dict[str, Any]:
    world = CallbackWorld()
    bodies = world.bodies

    def ours(rows: list[Any]) -> list[bytes]:
        return world.signed_callbacks(port, rows)

    def bare(rows: list[Any]) -> list[bytes]:
        return [
            raw_put(port, BARE_PATH, body, {"Content-Type": "application/json"})
            for body in bodies(rows)
        ]

    def bare_orm(rows: list[Any]) -> list[bytes]:
        return [
            raw_put(port, BARE_ORM_PATH, body, {"Content-Type": "application/json"})
            for body in bodies(rows)
        ]

    _wait_for_server(port, world.key)

    cpu_ms: dict[str, list[dict[str, float]]] = {}
    use_wrk = WRK is not None and not args.python_load

    def round_of(prepare: Any, count: int) -> float:
        rows = world.dispatched(count)
        requests = prepare(rows)
        before = cpu_snapshot(server_pid)
        if use_wrk:
            elapsed, statuses = load_wrk(port, requests, args.clients * args.threads)
        else:
            elapsed, statuses = load(port, requests, args.clients, args.threads)
        after = cpu_snapshot(server_pid)
        used = {part: round(s / count * 1000, 3) for part, s in cpu_used(before, after).items()}
        cpu_ms.setdefault(prepare.__name__, []).append(used)
        print(  # progress, on stderr: the JSON line stays last on stdout
            f"{prepare.__name__}: {count / elapsed:.0f}/s, CPU ms per callback: "
            f"web {used['web']}, postgres {used['postgres']}",
            file=sys.stderr,
        )
        world.check_recorded(prepare.__name__, rows, statuses)
        return count / elapsed

    for prepare in (bare, bare_orm, ours):
        round_of(prepare, 300)  # warm every web worker on every path
    cpu_ms.clear()
    ours_rates, bare_rates, orm_rates = [], [], []
    for _ in range(args.repeats):
        orm_rates.append(round_of(bare_orm, args.callbacks))
        bare_rates.append(round_of(bare, args.callbacks))
        ours_rates.append(round_of(ours, args.callbacks))
    best, baseline, orm_baseline = max(ours_rates), max(bare_rates), max(orm_rates)
    ratios = [o / b for o, b in zip(ours_rates, bare_rates, strict=True)]
    ratio = statistics.median(ratios)
    return {
        "name": "callbacks",
        "callbacks_per_second": round(best, 1),
        "baseline": "bare DRF view on the same server: parse JSON, one UPDATE and one INSERT",
        "baseline_per_second": round(baseline, 1),
        "ratio": round(ratio, 3),
        "ratio_of_best_rates": round(best / baseline, 3),
        "bare_orm_per_second": round(orm_baseline, 1),
        "ratio_to_bare_orm": round(
            statistics.median(o / b for o, b in zip(ours_rates, orm_rates, strict=True)), 3
        ),
        "rounds_per_second": [round(r, 1) for r in ours_rates],
        "baseline_rounds_per_second": [round(r, 1) for r in bare_rates],
        "round_ratios": [round(r, 3) for r in ratios],
        # CPU per callback (ms) of the web workers and of PostgreSQL, in the best rounds
        "cpu_ms_per_callback": {
            "ours": cpu_ms["ours"][ours_rates.index(best)],
            "bare": cpu_ms["bare"][bare_rates.index(baseline)],
        },
        "callbacks_per_round": args.callbacks,
        "load": "wrk" if use_wrk else "python clients",
        "web_workers": args.web_workers,
        "client_connections": args.clients * args.threads,
        "targets": {"ratio": RATIO_TARGET},
        "target_met": ratio >= RATIO_TARGET,
    }


def _wait_for_server(port: int, key: str) -> None:
    ping = f"GET /api/v1/ping HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if _send(port, (ping + "\r\nConnection: close\r\n\r\n").encode()) == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the server did not answer in 60 s")
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
