"""Benchmark: a burst of broker callbacks through gunicorn as deployed: is every one answered?

``--callbacks`` signed ``deleted`` callbacks (``bench_callbacks.py``'s requests), each from its
own caller on its own connection, all sent at once to gunicorn started with the documented
settings (``-c python:dropportal.gunicorn_conf``, ``--workers`` 2 as ``manage.py serve``).
Each caller is a broker's retry loop: an attempt that gets no answer within ``--timeout``
is sent again ``--retry`` seconds later, one refused (503 or 429) after its ``Retry-After``
(``--retry`` at least), until it is answered 200 or ``--deadline`` passes. The key's rate
limit is off (one key sends them all; the question is the server's capacity, not the
limiter's).

Where the waiting happens, measured on the side of the run:

- the kernel's accept queue of the listening socket (its length, read from ``/proc/net/tcp``
  every 10 ms): connections the workers have not taken yet, with no answer;
- the time to connect: beyond the queue's room the kernel drops the client's SYN, which
  resends it after 1, 3, 7... s (the SYNs dropped so, ``ListenDrops`` of /proc/net/netstat,
  are counted machine-wide);
- gunicorn's own time per request (its access log: from the request read to the answer
  written) against the callers' time per attempt: the rest is queueing before a worker
  thread took the request;
- PostgreSQL: this database's backends sampled every 50 ms from ``pg_stat_activity``
  (active, idle in a transaction, waiting on a lock).

Everything happens in a scratch database created next to ``DATABASE_URL``'s (it needs the
CREATEDB right) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_callback_burst.py [--callbacks 2000]

Prints one line of JSON last; the target: no attempt left unanswered, every 503 with
``Retry-After``, every callback recorded once. Exits 1 when it is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
from bench_callbacks import ROOT, CallbackWorld, _wait_for_server, free_port
from scratch_db import admin_execute, scratch_names, with_database


def serve(port: int, access_log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """gunicorn with the documented settings (``extra`` appended), its access log giving
    each request's status and gunicorn's own time for it in microseconds."""
    return subprocess.Popen(  # noqa: S603
        [
            *(sys.executable, "-m", "gunicorn", "dropportal.wsgi"),
            *("--config", "python:dropportal.gunicorn_conf"),
            *("--bind", f"127.0.0.1:{port}", "--workers", "2"),
            *("--access-logfile", str(access_log), "--access-logformat", "%(s)s %(D)s"),
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "DROPPORTAL_CALLBACK_RATE_LIMIT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# -- the callers ------------------------------------------------------------------------------


class Attempt:
    __slots__ = ("connect", "retry_after", "seconds", "status")

    def __init__(self) -> None:
        self.status: int | None = None  # None: no answer within the timeout
        self.retry_after: str | None = None
        self.connect: float | None = None
        self.seconds = 0.0


async def attempt(port: int, raw: bytes, timeout: float) -> Attempt:
    result = Attempt()
    started = time.monotonic()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            result.connect = time.monotonic() - started
            writer.write(raw)
            received = await reader.read()  # Connection: close, so until the end
        head = received.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        if head[0].startswith("HTTP/1.1 "):
            result.status = int(head[0].split()[1])
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "retry-after":
                    result.retry_after = value.strip()
    except (TimeoutError, OSError):
        pass  # no answer: timed out, refused or reset
    finally:
        if writer is not None:
            writer.close()
    result.seconds = time.monotonic() - started
    return result


async def burst(
    port: int, requests: list[bytes], *, timeout: float, retry: float, deadline: float
) -> tuple[list[list[Attempt]], float]:
    """Every request's attempts (its caller's retry loop), and the seconds until the last
    caller was answered 200 or gave up."""
    stop = time.monotonic() + deadline

    async def caller(raw: bytes) -> list[Attempt]:
        attempts = []
        while True:
            attempts.append(await attempt(port, raw, timeout))
            last = attempts[-1]
            wait = max(retry, float(last.retry_after or 0))
            if last.status == 200 or time.monotonic() + wait > stop:
                return attempts
            await asyncio.sleep(wait)

    started = time.monotonic()
    every = await asyncio.gather(*(caller(raw) for raw in requests))
    return list(every), time.monotonic() - started


def client_process(
    port: int, requests: list[bytes], args: argparse.Namespace, go: Any, out: Any
) -> None:
    go.wait()
    out.send(
        asyncio.run(
            burst(port, requests, timeout=args.timeout, retry=args.retry, deadline=args.deadline)
        )
    )


# -- where the waiting happens ----------------------------------------------------------------


class Sampler(threading.Thread):
    """Calls ``sample`` every ``interval`` seconds until stopped."""

    def __init__(self, sample: Any, interval: float) -> None:
        super().__init__(daemon=True)
        self.sample, self.interval, self.done = sample, interval, threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.sample()


def accept_queue_reader(port: int) -> Any:
    """A function returning the length of the accept queue of the socket listening on
    ``port`` (``rx_queue`` of its LISTEN line in /proc/net/tcp), None without /proc."""
    local = f":{port:04X}"

    def read() -> int | None:
        try:
            with open("/proc/net/tcp", encoding="ascii") as table:
                for line in table:
                    fields = line.split()
                    if fields[1].endswith(local) and fields[3] == "0A":
                        return int(fields[4].split(":")[1], 16)
        except OSError:
            return None
        return 0

    return read


def queue_process(port: int, stop: Any, out: Any) -> None:
    """The accept queue's length every 10 ms until ``stop``, sent back as a list."""
    read, lengths = accept_queue_reader(port), []
    while not stop.wait(0.01):
        lengths.append(read() or 0)
    out.send(lengths)


def listen_drops() -> int | None:
    """This machine's SYNs dropped so far because an accept queue was full (``ListenDrops``
    of /proc/net/netstat, every listening socket's together), None without /proc."""
    try:
        with open("/proc/net/netstat", encoding="ascii") as netstat:
            lines = [line.split() for line in netstat if line.startswith("TcpExt:")]
    except OSError:
        return None
    return int(dict(zip(lines[0], lines[1], strict=True))["ListenDrops"])


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50": round(at(0.5), 3),
        "p90": round(at(0.9), 3),
        "p99": round(at(0.99), 3),
        "max": round(ordered[-1], 3),
    }


# -- the bench --------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--callbacks", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds per attempt")
    parser.add_argument("--retry", type=float, default=2.0, help="seconds between attempts")
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds per caller")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument(
        "--gunicorn", nargs=argparse.REMAINDER, default=[], help="more gunicorn options"
    )
    args = parser.parse_args()
    base_url = os.environ.get("DATABASE_URL")
    if not base_url:
        print("set DATABASE_URL (a server where a scratch database may be created)")
        return 2
    admin_url, name = scratch_names(base_url, "bench_callback_burst")
    admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = with_database(base_url, name)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    server: subprocess.Popen[bytes] | None = None
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        with tempfile.TemporaryDirectory(prefix="bench_burst_") as scratch:
            port, access_log = free_port(), Path(scratch) / "access.log"
            server = serve(port, access_log, *args.gunicorn)
            result = run(args, port, access_log, name)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
        from django.db import connections

        connections.close_all()
        admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


def run(args: argparse.Namespace, port: int, access_log: Path, database: str) -> dict[str, Any]:
    from integrations.models import DeletionRequest, RequestState

    world = CallbackWorld()
    _wait_for_server(port, world.key)
    for _ in range(2):  # warm every worker (and its threads, if any) on the path
        warm = world.dispatched(50)
        warm_requests = world.signed_callbacks(port, warm)
        asyncio.run(burst(port, warm_requests, timeout=30, retry=1, deadline=60))
    access_log.write_text("")
    rows = world.dispatched(args.callbacks)
    requests = world.signed_callbacks(port, rows)

    backends: list[Counter[str]] = []
    observer = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)

    def sample_backends() -> None:
        found = observer.execute(
            "SELECT CASE WHEN wait_event_type = 'Lock' THEN 'lock wait' ELSE state END,"
            " count(*) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid() GROUP BY 1",
            [database],
        ).fetchall()
        backends.append(Counter({str(state): count for state, count in found}))

    # The callers and the accept queue's reader in processes of their own: one process's
    # GIL would make the callers late by the reading of /proc/net/tcp (thousands of lines).
    context = multiprocessing.get_context("fork")
    go, stop = context.Event(), context.Event()
    pipes, processes = [], []
    shares = [requests[i :: args.client_processes] for i in range(args.client_processes)]
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        *((client_process, (port, share, args, go)) for share in shares),
        (queue_process, (port, stop)),
    ]
    for target, arguments in jobs:
        parent_end, child_end = context.Pipe()
        process = context.Process(target=target, args=(*arguments, child_end))
        process.start()
        pipes.append(parent_end)
        processes.append(process)
    backends_sampler = Sampler(sample_backends, 0.05)
    backends_sampler.start()
    time.sleep(0.5)  # every process ready
    drops_before = listen_drops()
    go.set()
    try:
        answered = [pipe.recv() for pipe in pipes[:-1]]
    finally:
        stop.set()
        queue_lengths: list[int] = pipes[-1].recv()
        for process in processes:
            process.join()
        backends_sampler.done.set()
        backends_sampler.join()
        observer.close()
    drops_after = listen_drops()
    callers = [each for share, _ in answered for each in share]
    seconds = max(elapsed for _, elapsed in answered)

    attempts = [a for each in callers for a in each]
    outcomes = Counter("unanswered" if a.status is None else f"{a.status}" for a in attempts)
    without_retry_after = sum(1 for a in attempts if a.status == 503 and not a.retry_after)
    first = [each[0] for each in callers]
    recorded = DeletionRequest.objects.filter(
        pk__in=[r.pk for r in rows], state=RequestState.COMPLETED
    ).count()
    served: dict[str, list[float]] = {}
    for line in access_log.read_text().splitlines():
        status, micros = line.split()
        served.setdefault(status, []).append(int(micros) / 1e6)
    busy = [b for b in backends if b]
    return {
        "name": "callback_burst",
        "callbacks": args.callbacks,
        "attempt_timeout_s": args.timeout,
        "client_processes": args.client_processes,
        "gunicorn_extra": args.gunicorn,
        "attempts": dict(sorted(outcomes.items())),
        "attempts_503_without_retry_after": without_retry_after,
        "callers_answered_200": sum(1 for each in callers if each[-1].status == 200),
        "recorded": recorded,
        "seconds_until_every_caller_done": round(seconds, 2),
        "first_attempt_s": {
            "answered": percentiles([a.seconds for a in first if a.status is not None]),
            "connect": percentiles([a.connect for a in first if a.connect is not None]),
        },
        "answered_200_attempt_s": percentiles([a.seconds for a in attempts if a.status == 200]),
        "gunicorn_s_per_request": {s: percentiles(v) for s, v in sorted(served.items())},
        "accept_queue": {
            "max": max(queue_lengths, default=0),
            "share_of_samples_not_empty": round(
                sum(1 for q in queue_lengths if q) / max(1, len(queue_lengths)), 3
            ),
        },
        "syn_dropped_accept_queue_full": None
        if drops_before is None or drops_after is None
        else drops_after - drops_before,
        "postgres_backends_mean": {
            state: round(statistics.fmean(b.get(state, 0) for b in busy), 2)
            for state in sorted({s for b in busy for s in b})
        },
        "target_met": outcomes["unanswered"] == 0
        and without_retry_after == 0
        and recorded == args.callbacks,
    }


if __name__ == "__main__":
    sys.exit(main())
