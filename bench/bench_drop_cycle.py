"""Benchmark: import and match one DROP download of 1,000,000 work items.

The ZIP holds six lists (1,000,000 work items in all); 10 % of them match one of 1,000,000
registered consumers; one webhook integration is configured, so every match becomes a
queued deletion request with its delivery job (100 requests per job). The import runs
through ``drop_zip_import``, the service ``drop import`` and ``drop pull`` call.

Targets: import + match in 30 s or less, and matching at least 50 % of the speed of the bare
SQL join of the same two tables (the cycle's work items and the consumer hashes, counted by
``SELECT count(*) ... JOIN``), measured in the same run. "Matching" is the join that decides
each work item's fate and writes the (work item, consumer) pairs; creating the 100,000
deletion requests and their jobs is timed apart (``requests_seconds``), and
``ratio_with_requests`` shows the ratio with it included. The status of each work item is
written with the work item itself, in the import's one INSERT. Best of ``--repeats`` runs,
each on a fresh copy of the same database.

Everything happens in scratch databases created next to ``DATABASE_URL``'s (it needs the
CREATEDB right) and dropped at the end, so the bench never touches real data (the ledger
cannot be cleaned: it refuses DELETE).

    DATABASE_URL=postgres://... python bench/bench_drop_cycle.py [--items 1000000] [--repeats 3]

Prints one line of JSON last; exits 1 when a target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import base64
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
from scratch_db import admin_execute, scratch_names, with_database

TOTAL_TARGET_SECONDS = 30.0
MATCH_RATIO_TARGET = 0.5
LISTS = ("NDZ", "Email", "Phone", "MAID", "NameVIN", "CTVID")
HASH_TYPES = {
    "NDZ": "ndz",
    "Email": "email",
    "Phone": "phone",
    "MAID": "maid",
    "NameVIN": "name_vin",
    "CTVID": "ctvid",
}
BROKER_ID = "4821"


def lists_of(items: int) -> dict[str, list[tuple[str, str]]]:
    from devtools.drop_simulator import work_items

    per_list, extra = divmod(items, len(LISTS))
    lists, start = {}, 0
    for index, data_type in enumerate(LISTS):
        count = per_list + (1 if index < extra else 0)
        lists[data_type] = list(work_items(count, start=start))
        start += count
    return lists


def consumer_rows(
    lists: dict[str, list[tuple[str, str]]], consumers: int, match_every: int
) -> Iterator[tuple[str, str, bytes]]:
    """(remote_identifier, hash_type, 32-byte hash): every ``match_every``-th work item's
    hash, then unrelated hashes up to ``consumers``."""
    produced = 0
    for data_type, rows in lists.items():
        for _, hash_b64 in rows[::match_every]:
            produced += 1
            yield f"C-{produced}", HASH_TYPES[data_type], base64.b64decode(hash_b64)
    while produced < consumers:
        produced += 1
        digest = hashlib.sha256(f"unrelated consumer {produced}".encode()).digest()
        yield f"C-{produced}", LISTS_HASH_TYPES[produced % len(LISTS)], digest


LISTS_HASH_TYPES = [HASH_TYPES[name] for name in LISTS]


def load_consumers(
    url: str, broker_pk: int, lists: dict[str, list[tuple[str, str]]], consumers: int
) -> int:
    """Bare COPY of consumers and their hashes (setup, not timed); returns expected matches."""
    matches = 0
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy(
            "COPY integrations_consumer (id, broker_id, remote_identifier, remote_identifier_kind)"
            " FROM STDIN"
        ) as copy:
            for number in range(1, consumers + 1):
                copy.write_row((number, broker_pk, f"C-{number}", "external_id"))
        # The broker's partition of the consumer hashes, loaded as a first import loads
        # it: a plain table, indexed by ATTACH after the rows are in.
        partition = f"integrations_consumerhash_b{int(broker_pk)}"
        cursor.execute(f"CREATE TABLE {partition} (LIKE integrations_consumerhash)")
        with cursor.copy(
            f"COPY {partition} (id, consumer_id, broker_id, hash_type, hash) FROM STDIN"
        ) as copy:
            for number, (_, hash_type, digest) in enumerate(
                consumer_rows(lists, consumers, 10), start=1
            ):
                copy.write_row((number, number, broker_pk, hash_type, digest))
        cursor.execute("SET maintenance_work_mem = '512MB'")
        cursor.execute(
            f"ALTER TABLE integrations_consumerhash ATTACH PARTITION {partition}"
            f" FOR VALUES IN ({int(broker_pk)})"
        )
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('integrations_consumerhash', 'id'), %s)",
            [consumers],
        )
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('integrations_consumer', 'id'), %s)",
            [consumers],
        )
        conn.commit()
    for rows in lists.values():
        matches += len(rows[::10])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE integrations_consumer")
        conn.execute("VACUUM ANALYZE integrations_consumerhash")
    return matches


def backend_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of a PostgreSQL backend, from /proc when the server runs
    on this machine (None otherwise). Steadier than wall time when others share the cores;
    parallel workers' CPU is not included."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def switch_database(url: str) -> None:
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = urlsplit(url).path.lstrip("/")


def run_once(zip_path: Path) -> dict[str, float | int]:
    from django.db import connection

    from integrations.models import Broker
    from integrations.services.cycle.drop_import import IMPORT_WORK_MEM, drop_zip_import

    broker = Broker.objects.get(broker_id=BROKER_ID)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = int(cursor.fetchone()[0])
    db_cpu, py_cpu = backend_cpu_seconds(backend), time.process_time()
    started = time.perf_counter()
    result = drop_zip_import(broker=broker, path=zip_path, actor="bench")
    total = time.perf_counter() - started
    db_cpu = cpu_delta(db_cpu, backend_cpu_seconds(backend))
    py_cpu = time.process_time() - py_cpu
    # The baseline at its best: statistics and hint bits set (VACUUM ANALYZE), the same
    # work_mem as the import, best of three.
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE integrations_workitem")
        cursor.execute(f"SET work_mem = '{IMPORT_WORK_MEM}'")
    join_best = float("inf")
    with connection.cursor() as cursor:
        for _ in range(3):
            began = time.perf_counter()
            cursor.execute(
                "SELECT count(*) FROM integrations_workitem w"
                " JOIN integrations_consumerhash ch"
                "   ON ch.broker_id = w.broker_id AND ch.hash = w.hash"
                "  AND ch.hash_type = w.hash_type"
                " WHERE w.cycle_id = %s AND ch.broker_id = %s",  # one partition
                [result.cycle.pk, broker.pk],
            )
            join_rows = int(cursor.fetchone()[0])
            join_best = min(join_best, time.perf_counter() - began)
        cursor.execute(
            "SELECT count(*) FROM procrastinate_jobs"
            " WHERE task_name = 'integrations.tasks.deliver_deletion_requests'"
        )
        jobs = int(cursor.fetchone()[0])
    connection.close()
    return {
        "total_seconds": total,
        "db_cpu_seconds": db_cpu if db_cpu is not None else -1.0,
        "py_cpu_seconds": py_cpu,
        "import_seconds": result.import_seconds,
        "match_seconds": result.match_seconds,
        "requests_seconds": result.requests_seconds,
        "commit_seconds": result.commit_seconds,
        "bare_join_seconds": join_best,
        "bare_join_rows": join_rows,
        "work_items": result.cycle.work_items,
        "matched": result.cycle.matched,
        "not_found": result.cycle.not_found,
        "deletion_requests": result.requests.deletion_requests,
        "queued": result.requests.queued,
        "dispatch_jobs": jobs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--consumers", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates scratch databases next to it)")
        return 2
    admin_url, template = scratch_names(base_url, "bench_cycle")
    template_url = with_database(base_url, template)
    os.environ["DATABASE_URL"] = template_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    import django

    admin_execute(admin_url, f'CREATE DATABASE "{template}"')
    runs: list[dict[str, float | int]] = []
    clones: list[str] = []
    try:
        django.setup()
        from django.core.management import call_command

        from devtools.drop_simulator import build_drop_zip
        from integrations.models import Integration, IntegrationKind
        from integrations.services.staff.brokers import broker_create

        call_command("migrate", verbosity=0)
        broker = broker_create(broker_id=BROKER_ID, name="Bench", actor="bench")
        Integration.objects.create(
            broker=broker,
            kind=IntegrationKind.WEBHOOK,
            name="bench webhook",
            url="https://broker.example/drop",
            webhook_secret="whsec_" + "x" * 43,
        )
        lists = lists_of(args.items)
        expected_matches = load_consumers(template_url, broker.pk, lists, args.consumers)
        with tempfile.TemporaryDirectory() as directory:
            zip_path = Path(directory) / f"20261120_{BROKER_ID}_DROP.zip"
            zip_path.write_bytes(build_drop_zip(BROKER_ID, "20261120", lists))
            del lists
            zip_mb = zip_path.stat().st_size / 1e6
            switch_database(base_url)  # no session may stay on the template while cloning
            for repeat in range(args.repeats):
                clone = f"{template}_{repeat}"
                admin_execute(admin_url, f'CREATE DATABASE "{clone}" TEMPLATE "{template}"')
                clones.append(clone)
                switch_database(with_database(base_url, clone))
                runs.append(run_once(zip_path))
                print(json.dumps({"run": repeat + 1, **runs[-1]}), flush=True)
                switch_database(base_url)
                admin_execute(admin_url, f'DROP DATABASE "{clone}"')
                clones.remove(clone)
    finally:
        from django.db import connection

        connection.close()
        for name in [*clones, template]:
            admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    best = min(runs, key=lambda run: run["total_seconds"])
    best_match = min(
        runs, key=lambda run: float(run["match_seconds"]) / float(run["bare_join_seconds"])
    )
    ratio = float(best_match["bare_join_seconds"]) / float(best_match["match_seconds"])
    with_requests = float(best_match["bare_join_seconds"]) / (
        float(best_match["match_seconds"]) + float(best_match["requests_seconds"])
    )
    ok_counts = all(
        run["matched"] == expected_matches and run["bare_join_rows"] == expected_matches
        for run in runs
    )
    result = {
        "name": "drop_cycle",
        "work_items": args.items,
        "consumers": args.consumers,
        "zip_mb": round(zip_mb, 1),
        "matched": best["matched"],
        "deletion_requests": best["deletion_requests"],
        "dispatch_jobs": best["dispatch_jobs"],
        "total_seconds": round(float(best["total_seconds"]), 2),
        "import_seconds": round(float(best["import_seconds"]), 2),
        "match_seconds": round(float(best_match["match_seconds"]), 2),
        "requests_seconds": round(float(best["requests_seconds"]), 2),
        "commit_seconds": round(float(best["commit_seconds"]), 2),
        "db_cpu_seconds": round(min(float(run["db_cpu_seconds"]) for run in runs), 2),
        "py_cpu_seconds": round(min(float(run["py_cpu_seconds"]) for run in runs), 2),
        "baseline": "bare SQL join (count) of the cycle's work items with the consumer hashes",
        "bare_join_seconds": round(float(best_match["bare_join_seconds"]), 2),
        "ratio": round(ratio, 2),
        "ratio_with_requests": round(with_requests, 2),
        "total_target_seconds": TOTAL_TARGET_SECONDS,
        "ratio_target": MATCH_RATIO_TARGET,
        "counts_correct": ok_counts,
        "runs": len(runs),
        "target_met": ok_counts
        and float(best["total_seconds"]) <= TOTAL_TARGET_SECONDS
        and ratio >= MATCH_RATIO_TARGET,
    }
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
