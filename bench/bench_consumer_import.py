"""Benchmark: import N consumers (1,000,000 by default; an email and a phone each) from a CSV.

The import runs ``manage.py consumers import --broker B FILE --json`` (``call_command``) in
a child process, so its peak memory is its own: the largest sum of the resident memory of
the process and its hashing workers, sampled every 50 ms (and never below the process's
own ``ru_maxrss``). The baseline is what the same work costs with nothing of ours: a bare hash loop
(standardize and SHA-256 each identifier, as the import does) writing COPY text, then a bare
``COPY`` of it into two tables equivalent to the consumers and consumer hashes (``LIKE ...
INCLUDING ALL``: same columns, defaults and indexes), measured in the same run. Each run
starts from empty tables after a checkpoint.

Targets: 15 s or less per million consumers, faster than the baseline (baseline time /
import time of 1.2 or more), peak memory 500 MB or less. Best of ``--repeats`` runs of each.

Everything happens in a scratch database created next to ``DATABASE_URL``'s (the role
needs CREATEDB) and dropped at the end: the ledger refuses DELETE, so the bench must never
write into a real database.

    DATABASE_URL=postgres://... python bench/bench_consumer_import.py [--consumers 10000000 ...]

Several sizes (``--consumers 1000000 10000000``) measure growth: their runs take turns,
repeat by repeat, and the best time of each larger size must grow no faster than its
number of consumers against the smallest's (10 M in at most 10 times the 1 M time). Each
import of a growth run is followed by the **floor**: PostgreSQL alone writing what the
import wrote (its consumers and hashes copied into new tables, then given the same
indexes, in one transaction), with no logic of ours. The floor's growth is how much faster
than its rows the machine's own writes grow, measured in the same run.

The file is in key order unless ``--shuffled``: a broker's first load from a file in key
order is merged round by round as it is read, any other order by the general merge at
the end. ``--kinds`` adds a ``remote_identifier_kind`` column.

Prints one line of JSON last; exits 1 when a target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import subprocess
import tempfile
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import psycopg
from scratch_db import admin_execute, scratch_names, with_database

TARGET_SECONDS_PER_MILLION = 15.0
TARGET_RATIO = 1.2
TARGET_PEAK_MB = 500.0
BROKER_ID = "4821"
FIRST = ["Anna", "Juan", "José", "Mary", "Danielle", "Eve", "Ivan", "Chen"]
DOMAINS = ["Domain.com", "example.org", "mail.example.net", "Gmail.com", "corp.example"]


def write_csv(
    path: Path, consumers: int, seed: int, *, shuffled: bool = False, kinds: bool = False
) -> None:
    """Consumers as a broker would export them: mixed case, punctuation, stray spaces.

    In key order (``CUST-000000000``, ...), as an export sorted by its key is, or
    ``shuffled``: the same keys in a random order, which the import merges the general way.
    ``kinds``: a ``remote_identifier_kind`` column, ``account_id`` on every row.
    """
    rng = random.Random(seed)
    order: range | array[int] = range(consumers)
    if shuffled:
        # One buffer, given back to the system when freed: the import's child process
        # starts as a fork of this one, and Linux counts the fork's memory in its peak.
        order = array("q", order)
        rng.shuffle(order)
    with path.open("w", encoding="utf-8", newline="") as out:
        out.write(
            "remote_identifier,email,phone" + (",remote_identifier_kind\n" if kinds else "\n")
        )
        kind = ",account_id" if kinds else ""
        for i in order:
            email = f"{rng.choice(FIRST)}.Person{i}@{rng.choice(DOMAINS)}"
            if i % 10 == 0:
                email = f" {email} "
            phone = f"+1({rng.randint(200, 999)}){rng.randint(200, 999)}-{i % 10_000:04d}"
            out.write(f"CUST-{i:09d},{email},{phone}{kind}\n")


def write_baseline_files(
    csv_path: Path, consumers_path: Path, hashes_path: Path, broker_pk: int
) -> None:
    """The same rows, already standardized and hashed, as COPY text for the baseline."""
    from integrations.drop.standardize import standardize_email, standardize_phone

    sha = hashlib.sha256
    with (
        csv_path.open(encoding="utf-8") as source,
        consumers_path.open("w", encoding="utf-8") as consumers,
        hashes_path.open("w", encoding="utf-8") as hashes,
    ):
        next(source)
        for number, line in enumerate(source, start=1):
            rid, email, phone = line.rstrip("\n").split(",")
            consumers.write(f"{number}\t{broker_pk}\t{rid}\texternal_id\n")
            e = sha(standardize_email(email).encode()).hexdigest()
            p = sha(standardize_phone(phone).encode()).hexdigest()
            b = broker_pk
            hashes.write(f"{b}\t{number}\temail\t\\\\x{e}\n{b}\t{number}\tphone\t\\\\x{p}\n")


def fresh_start(url: str, *, baseline: bool = True) -> None:
    """Empty consumer tables, no broker partition, a checkpoint; ``baseline``: the
    baseline's tables emptied too."""
    with psycopg.connect(url, autocommit=True) as conn:
        # CASCADE: the (empty) deletion requests of the scratch database refer to consumers.
        conn.execute("TRUNCATE integrations_consumerhash, integrations_consumer CASCADE")
        # A broker's first load: its partition of the consumer hashes does not exist yet.
        for (partition,) in conn.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits"
            " WHERE inhparent = 'integrations_consumerhash'::regclass"
            "   AND inhrelid <> 'integrations_consumerhash_default'::regclass"
        ).fetchall():
            conn.execute(f"DROP TABLE {partition}")
        if baseline:
            conn.execute("TRUNCATE baseline_consumerhash, baseline_consumer")
        conn.execute("VACUUM ANALYZE")
        checkpoint(conn)


def checkpoint(conn: psycopg.Connection[Any]) -> None:
    """Each run starts with the same WAL and dirty pages. CHECKPOINT needs superuser or
    pg_checkpoint; without them the runs are only less even."""
    with contextlib.suppress(psycopg.Error):
        conn.execute("CHECKPOINT")


def backend_cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of a PostgreSQL backend, read from /proc when the server is
    on this host; None otherwise. Unlike wall time it hardly moves with other load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def baseline_run(
    url: str, csv_path: Path, consumers_path: Path, hashes_path: Path, broker_pk: int
) -> dict[str, float | None]:
    """The bare hash loop, then a bare COPY of its rows into the equivalent tables."""
    started = time.perf_counter()
    write_baseline_files(csv_path, consumers_path, hashes_path, broker_pk)
    hash_seconds = time.perf_counter() - started
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]  # type: ignore[index]
        cpu_before = backend_cpu_seconds(pid)
        for table, columns, path in (
            ("baseline_consumer", "id, broker_id, remote_identifier, remote_identifier_kind",
             consumers_path),
            ("baseline_consumerhash", "broker_id, consumer_id, hash_type, hash", hashes_path),
        ):  # fmt: skip
            with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy, path.open("rb") as f:
                while block := f.read(1 << 20):
                    copy.write(block)
        conn.commit()
        return {
            "seconds": time.perf_counter() - started,
            "hash_loop_seconds": hash_seconds,
            "db_cpu_seconds": cpu_delta(cpu_before, backend_cpu_seconds(pid)),
        }


def floor_run(url: str, broker_pk: int) -> dict[str, float | None]:
    """The import's result written again by PostgreSQL alone: the consumers and the broker's
    partition of the hashes copied into new tables (CREATE TABLE AS), then the same
    indexes built over them, with the import's memory settings, in one transaction."""
    from integrations.consumers.fresh_partition import partition_name
    from integrations.consumers.load import MERGE_MAINTENANCE_WORK_MEM, MERGE_WORK_MEM

    sources = {
        "floor_consumer": "integrations_consumer",
        "floor_consumerhash": partition_name(broker_pk),
    }
    with psycopg.connect(url, autocommit=True) as conn:
        checkpoint(conn)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        cpu_before = backend_cpu_seconds(pid)
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(f"SET LOCAL work_mem = '{MERGE_WORK_MEM}'")
            conn.execute(f"SET LOCAL maintenance_work_mem = '{MERGE_MAINTENANCE_WORK_MEM}'")
            for copy, source in sources.items():
                conn.execute(f"CREATE TABLE {copy} AS SELECT * FROM {source}")
                indexes = conn.execute(
                    "SELECT pg_get_indexdef(indexrelid) FROM pg_index"
                    " WHERE indrelid = %s::regclass ORDER BY indisprimary DESC, indexrelid",
                    [source],
                ).fetchall()
                for (definition,) in indexes:
                    # "CREATE [UNIQUE] INDEX name ON public.table USING ...": the copy's.
                    conn.execute(re.sub(r" INDEX \S+ ON \S+ ", f" INDEX ON {copy} ", definition))
        seconds = time.perf_counter() - started
        cpu = cpu_delta(cpu_before, backend_cpu_seconds(pid))
        conn.execute(f"DROP TABLE {', '.join(sources)}")
    return {"seconds": seconds, "db_cpu_seconds": cpu}


def import_run(url: str, csv_path: Path) -> dict[str, float | int]:
    """The command in a child process: its time and its peak memory."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "dropportal.settings"}
    proc = subprocess.run(  # noqa: S603
        [sys.executable, __file__, "--child", str(csv_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"import failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, now (Linux /proc)."""
    total_kb = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total_kb / 1024


class TreeMemorySampler:
    """The peak of ``tree_rss_mb`` over the import, sampled every 50 ms in a thread: the
    importing process and its hashing workers together. (``ru_maxrss`` of a spawned worker
    is no help: Linux keeps the forked parent's peak across the exec.)"""

    def __init__(self) -> None:
        import threading

        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_mb = max(self.peak_mb, tree_rss_mb(os.getpid()))

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def table_sizes(url: str) -> dict[str, int]:
    """Bytes on disk of each consumer table, with its indexes (after VACUUM)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE integrations_consumer, integrations_consumerhash")
        sizes = {}
        for table in ("integrations_consumer", "integrations_consumerhash"):
            # A partitioned table's own size is nothing: sum its partitions'.
            row = conn.execute(
                "SELECT coalesce(sum(pg_table_size(relid)), pg_table_size(%s::regclass)),"
                "       coalesce(sum(pg_indexes_size(relid)), pg_indexes_size(%s::regclass))"
                "  FROM pg_partition_tree(%s::regclass) WHERE isleaf",
                [table, table, table],
            ).fetchone()
            assert row is not None
            # sum() over bigint is numeric: ints, so the summary line stays JSON.
            sizes[f"{table}_table_bytes"], sizes[f"{table}_index_bytes"] = map(int, row)
        return sizes


def child(csv_path: str) -> None:
    import io
    import resource

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    with connection.cursor() as cursor:  # the connection the command will use
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    out = io.StringIO()
    cpu_before, py_before = backend_cpu_seconds(pid), time.process_time()
    started = time.perf_counter()
    with TreeMemorySampler() as sampler:
        call_command("consumers", "import", "--broker", BROKER_ID, csv_path, "--json", stdout=out)
    seconds = time.perf_counter() - started
    db_cpu = cpu_delta(cpu_before, backend_cpu_seconds(pid))
    py_cpu = time.process_time() - py_before
    counts = json.loads(out.getvalue())
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    peak_mb = max(own_mb, sampler.peak_mb)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "db_cpu_seconds": db_cpu,
                "py_cpu_seconds": py_cpu,
                "peak_mb": peak_mb,
                "process_peak_mb": own_mb,
                "tree_peak_mb": sampler.peak_mb,
                "workers_cpu_seconds": (
                    resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
                    + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
                ),
                "consumers_created": counts["consumers_created"],
                "hashes_added": counts["hashes_added"],
                "rows_rejected": counts["rows_rejected"],
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--consumers",
        type=int,
        nargs="+",
        default=[1_000_000],
        help="one size, or several: their runs then take turns (growth, see the module doc)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20260801)
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="the import alone (a 30 M run: the baseline's random inserts take far longer)",
    )
    parser.add_argument(
        "--shuffled",
        action="store_true",
        help="the file's keys in a random order (default: in key order, which a first load"
        " merges as it reads)",
    )
    parser.add_argument(
        "--kinds",
        action="store_true",
        help="a remote_identifier_kind column, named on every row",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    if any(n < 1 for n in args.consumers) or args.repeats < 1:
        print("--consumers and --repeats must be 1 or more")
        return 2

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates a scratch database next to it)")
        return 2
    admin_url, scratch = scratch_names(base_url, "bench_consumers")
    url = with_database(base_url, scratch)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    admin_execute(admin_url, f'CREATE DATABASE "{scratch}"')
    runs = {n: Runs() for n in sorted(set(args.consumers))}  # the smallest first
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from integrations.services.staff.brokers import broker_create

        call_command("migrate", verbosity=0)
        broker = broker_create(broker_id=BROKER_ID, name="Bench", actor="bench")
        connection.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE baseline_consumer (LIKE integrations_consumer INCLUDING ALL)"
            )
            conn.execute(
                "CREATE TABLE baseline_consumerhash (LIKE integrations_consumerhash INCLUDING ALL)"
            )
        with tempfile.TemporaryDirectory() as directory:
            consumers_path = Path(directory) / "baseline_consumers.tsv"
            hashes_path = Path(directory) / "baseline_hashes.tsv"
            for n, measured in runs.items():
                measured.csv_path = Path(directory) / f"consumers_{n}.csv"
                write_csv(measured.csv_path, n, args.seed, shuffled=args.shuffled, kinds=args.kinds)
                measured.csv_mb = measured.csv_path.stat().st_size / 1e6
            # Sizes take turns, repeat by repeat: a drift of the machine's speed over the
            # bench (seen here on shared VMs) then weighs on every size alike.
            for repeat in range(args.repeats):
                for n, measured in runs.items():
                    if not args.no_baseline:
                        fresh_start(url)
                        measured.baselines.append(
                            baseline_run(
                                url, measured.csv_path, consumers_path, hashes_path, broker.pk
                            )
                        )
                    fresh_start(url)
                    measured.imports.append(import_run(url, measured.csv_path))
                    if len(runs) > 1:
                        measured.floors.append(floor_run(url, broker.pk))
                    line = {
                        "run": repeat + 1,
                        "consumers": n,
                        "baseline": measured.baselines[-1] if measured.baselines else None,
                        "import": measured.imports[-1],
                        "floor": measured.floors[-1] if measured.floors else None,
                    }
                    print(json.dumps(line), flush=True)
                    if repeat == args.repeats - 1:  # bytes on disk per consumer, once a size
                        measured.sizes = table_sizes(url)
    finally:
        admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')

    order = "shuffled" if args.shuffled else "key"
    results = [
        {**summary(n, measured), "file_order": order, "kinds_column": args.kinds}
        for n, measured in runs.items()
    ]
    if len(results) == 1:
        print(json.dumps(results[0]))
        return 0 if results[0]["target_met"] else 1
    # Growth: the best time of each size against the smallest's; linear growth at most.
    # The floor's growth beside it, from the same runs.
    growth, growth_per_run = growth_of(results, "import")
    floor_growth, floor_growth_per_run = growth_of(results, "floor")
    smallest = results[0]
    growth_met = all(
        result["import_seconds"] / smallest["import_seconds"]
        <= result["consumers"] / smallest["consumers"]
        for result in results[1:]
    )
    met = growth_met and all(result["target_met"] for result in results)
    print(
        json.dumps(
            {
                "name": "consumer_import_growth",
                "sizes": results,
                "growth": growth,
                "growth_per_run": growth_per_run,
                "floor_growth": floor_growth,
                "floor_growth_per_run": floor_growth_per_run,
                "target_growth": "the size ratio at most",
                "growth_met": growth_met,
                "target_met": met,
            }
        )
    )
    return 0 if met else 1


def growth_of(
    results: list[dict[str, Any]], kind: str
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each larger size's best time against the smallest's, and repeat by repeat against the
    smallest's run of the same repeat: when the machine's speed drifts between repeats,
    these ratios move less than the times. ``kind``: "import" or "floor", the summaries'
    ``{kind}_seconds`` and ``{kind}_seconds_per_run``."""
    smallest, *larger = results
    if smallest[f"{kind}_seconds"] is None:
        return {}, {}
    best, per_run = {}, {}
    for result in larger:
        best[str(result["consumers"])] = round(
            result[f"{kind}_seconds"] / smallest[f"{kind}_seconds"], 2
        )
        per_run[str(result["consumers"])] = [
            round(a / b, 2)
            for a, b in zip(
                result[f"{kind}_seconds_per_run"],
                smallest[f"{kind}_seconds_per_run"],
                strict=True,
            )
        ]
    return best, per_run


@dataclass
class Runs:
    """One size's CSV and what its runs measured."""

    csv_path: Path = Path()
    csv_mb: float = 0.0
    imports: list[dict[str, Any]] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    floors: list[dict[str, Any]] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)


def summary(consumers: int, measured: Runs) -> dict[str, Any]:
    """One size's best import against its best baseline, and whether its targets are met."""
    imports, baselines, sizes = measured.imports, measured.baselines, measured.sizes
    best = min(imports, key=lambda run: run["seconds"])
    baseline = min((float(run["seconds"]) for run in baselines), default=None)
    seconds = float(best["seconds"])
    db_cpu = [run["db_cpu_seconds"] for run in imports if run["db_cpu_seconds"] is not None]
    baseline_cpu = [run["db_cpu_seconds"] for run in baselines if run["db_cpu_seconds"] is not None]
    peak_mb = max(float(run["peak_mb"]) for run in imports)
    ratio = baseline / seconds if baseline is not None else None
    target_seconds = TARGET_SECONDS_PER_MILLION * consumers / 1_000_000
    counts_correct = all(
        run["consumers_created"] == consumers
        and run["hashes_added"] == 2 * consumers
        and run["rows_rejected"] == 0
        for run in imports
    )
    return {
        "name": "consumer_import",
        "consumers": consumers,
        "hashes": 2 * consumers,
        "csv_mb": round(measured.csv_mb, 1),
        "import_seconds": round(seconds, 2),
        "import_seconds_per_run": [round(float(run["seconds"]), 2) for run in imports],
        "floor_seconds": (
            round(min(float(run["seconds"]) for run in measured.floors), 2)
            if measured.floors
            else None
        ),
        "floor_seconds_per_run": [round(float(run["seconds"]), 2) for run in measured.floors],
        "consumers_per_s": round(consumers / seconds),
        "baseline": "bare hash loop, then bare COPY of its rows into equivalent tables",
        "baseline_seconds": round(baseline, 2) if baseline is not None else None,
        "ratio": round(ratio, 3) if ratio is not None else None,
        # Each pair ran back to back, so a pair's ratio suffers less from other load.
        "ratio_per_run": [
            round(float(b["seconds"]) / float(i["seconds"]), 3)
            for b, i in zip(baselines, imports, strict=True)
        ]
        if baselines
        else [],
        # CPU seconds of the database backend: far steadier than wall time on a shared
        # machine. The import's Python work (py_cpu) runs on the other core meanwhile.
        "import_db_cpu_seconds": round(min(db_cpu), 2) if db_cpu else None,
        "import_py_cpu_seconds": round(float(best["py_cpu_seconds"]), 2),
        "import_workers_cpu_seconds": round(float(best["workers_cpu_seconds"]), 2),
        "baseline_hash_loop_seconds": (
            round(min(float(run["hash_loop_seconds"]) for run in baselines), 2)
            if baselines
            else None
        ),
        "baseline_db_cpu_seconds": round(min(baseline_cpu), 2) if baseline_cpu else None,
        "cpu_ratio": round(min(baseline_cpu) / min(db_cpu), 3) if db_cpu and baseline_cpu else None,
        "peak_mb": round(peak_mb, 1),
        "disk_bytes_per_consumer": round(sum(sizes.values()) / consumers),
        "disk": sizes,
        "target_seconds": target_seconds,
        "target_ratio": TARGET_RATIO,
        "target_peak_mb": TARGET_PEAK_MB,
        "counts_correct": counts_correct,
        "target_met": counts_correct
        and seconds <= target_seconds
        and (ratio is None or ratio >= TARGET_RATIO)
        and peak_mb <= TARGET_PEAK_MB,
    }


if __name__ == "__main__":
    sys.exit(main())
