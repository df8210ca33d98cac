"""Benchmark: a broker's first load, merged as it is read against the general merge.

The same file of N consumers (10,000,000 by default; an email and a phone each), in key
order, is imported into an empty broker (no consumer, no partition of its hashes yet) by
``manage.py consumers import`` in a child process, twice per pair: once as it goes today
(its rounds merged as they are read, ``merge_streamed``), once with the general merge
forced (every round staged, merged once all are read, ``merge_general``), as a file out of
key order would be. Both fill a fresh partition and build its indexes at the end. The
pairs alternate their order (streamed first, then general first, ...): on a shared
machine a drift of its speed then weighs on both paths alike.

The figure is the general merge's time over the streamed path's, per pair and for the
best of each. The rule it serves: the streamed path is kept only while the general merge
takes more than ``KEEP_ABOVE`` times its time (5 % more); the bench misses its target
when that is no longer so (docs/benchmarks.md, consumer import: the two paths at 10 M).

Everything happens in a scratch database created next to ``DATABASE_URL``'s (the role
needs CREATEDB) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_consumer_merge_paths.py [--consumers N]

Prints one line of JSON per import, and a summary line last; exits 1 when a target is
missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import subprocess
import tempfile
import time
from typing import Any

from bench_consumer_import import (
    BROKER_ID,
    TreeMemorySampler,
    backend_cpu_seconds,
    cpu_delta,
    fresh_start,
    write_csv,
)
from scratch_db import admin_execute, scratch_names, with_database

PATHS = ("streamed", "general")
KEEP_ABOVE = 1.05  # the general merge's time over the streamed path's, for the latter to stay


def import_run(url: str, csv_path: Path, path: str) -> dict[str, Any]:
    """The command in a child process, through ``path``: its time and what it merged."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "dropportal.settings"}
    proc = subprocess.run(  # noqa: S603
        [sys.executable, __file__, "--child", str(csv_path), "--path", path],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"import failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child(csv_path: str, path: str) -> None:
    import dataclasses
    import io

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from integrations.consumers import load

    if path == "general":
        # Every round as if its pointers did not ascend: staged, then merged at the end.
        round_ = load.StagedBatches.round

        def unordered(self: load.StagedBatches, copy_data: bytes | bytearray) -> load.Round:
            return dataclasses.replace(round_(self, copy_data), ascending=False)

        load.StagedBatches.round = unordered  # type: ignore[method-assign]
    merged: list[load.Merged] = []
    finish = load.ConsumerLoad.finish

    def finish_kept(self: load.ConsumerLoad, *, replace: bool = False) -> load.Merged:
        merged.append(finish(self, replace=replace))
        return merged[-1]

    load.ConsumerLoad.finish = finish_kept  # type: ignore[method-assign]

    with connection.cursor() as cursor:  # the connection the command will use
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    out = io.StringIO()
    cpu_before = backend_cpu_seconds(pid)
    started = time.perf_counter()
    with TreeMemorySampler() as sampler:
        call_command("consumers", "import", "--broker", BROKER_ID, csv_path, "--json", stdout=out)
    seconds = time.perf_counter() - started
    counts = json.loads(out.getvalue())
    (result,) = merged
    print(
        json.dumps(
            {
                "path": path,
                "seconds": seconds,
                "db_cpu_seconds": cpu_delta(cpu_before, backend_cpu_seconds(pid)),
                "peak_mb": sampler.peak_mb,
                "rounds_streamed": result.rounds_streamed,
                "rounds_at_end": result.rounds_at_end,
                "fresh_partition": result.fresh_partition,
                "consumers_created": counts["consumers_created"],
                "hashes_added": counts["hashes_added"],
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--consumers", type=int, default=10_000_000)
    parser.add_argument("--pairs", type=int, default=2, help="each pair: both paths, in turn")
    parser.add_argument("--seed", type=int, default=20260801)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.path)
        return 0
    if args.consumers < 1 or args.pairs < 1:
        print("--consumers and --pairs must be 1 or more")
        return 2
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates a scratch database next to it)")
        return 2
    admin_url, scratch = scratch_names(base_url, "bench_merge_paths")
    url = with_database(base_url, scratch)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    admin_execute(admin_url, f'CREATE DATABASE "{scratch}"')
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from integrations.services.staff.brokers import broker_create

        call_command("migrate", verbosity=0)
        broker_create(broker_id=BROKER_ID, name="Bench", actor="bench")
        connection.close()
        with tempfile.TemporaryDirectory() as directory:
            csv_path = Path(directory) / "consumers.csv"
            write_csv(csv_path, args.consumers, args.seed)
            for pair in range(args.pairs):
                order = PATHS if pair % 2 == 0 else PATHS[::-1]
                for path in order:
                    fresh_start(url, baseline=False)
                    run = import_run(url, csv_path, path)
                    runs[path].append(run)
                    print(json.dumps({"pair": pair + 1, **run}), flush=True)
    finally:
        admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')

    streamed, general = runs["streamed"], runs["general"]
    best = {path: min(float(run["seconds"]) for run in runs[path]) for path in PATHS}
    ratio = best["general"] / best["streamed"]
    paths_taken = all(
        run["rounds_at_end"] == 0 and run["rounds_streamed"] > 0 for run in streamed
    ) and all(run["rounds_streamed"] == 0 and run["rounds_at_end"] > 0 for run in general)
    counts_correct = all(
        run["consumers_created"] == args.consumers
        and run["hashes_added"] == 2 * args.consumers
        and run["fresh_partition"]
        for run in streamed + general
    )
    print(
        json.dumps(
            {
                "name": "consumer_merge_paths",
                "consumers": args.consumers,
                "streamed_seconds": round(best["streamed"], 2),
                "general_seconds": round(best["general"], 2),
                "streamed_seconds_per_pair": [round(float(r["seconds"]), 2) for r in streamed],
                "general_seconds_per_pair": [round(float(r["seconds"]), 2) for r in general],
                "ratio": round(ratio, 3),
                # Each pair ran back to back: its own ratio suffers less from other load.
                "ratio_per_pair": [
                    round(float(g["seconds"]) / float(s["seconds"]), 3)
                    for s, g in zip(streamed, general, strict=True)
                ],
                "streamed_db_cpu_seconds": [r["db_cpu_seconds"] for r in streamed],
                "general_db_cpu_seconds": [r["db_cpu_seconds"] for r in general],
                "peak_mb": round(max(float(r["peak_mb"]) for r in streamed + general), 1),
                "keep_streamed_above": KEEP_ABOVE,
                "paths_taken": paths_taken,
                "counts_correct": counts_correct,
                "target_met": paths_taken and counts_correct and ratio > KEEP_ABOVE,
            }
        )
    )
    return 0 if paths_taken and counts_correct and ratio > KEEP_ABOVE else 1


if __name__ == "__main__":
    sys.exit(main())
