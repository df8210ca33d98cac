"""Benchmark: export 1,000,000 outcome rows as CSV with ``manage.py outcomes export``.

The scratch database holds one broker, one cycle of 1,000,000 work items (reported, as
after an upload) and one deletion request per work item, in a mix of outcomes (some failed,
with error messages that look like formulas); each request has one delivery attempt, every
20th three (two 503s, then the 2xx). The
export runs as the real command in a child process (``outcomes export --out FILE``), so
its time includes starting Django, and its peak memory is the child's maximum RSS.

Targets: 15 seconds or less, peak memory under 200 MB. Best of ``--repeats`` runs.

Everything happens in a scratch database created next to ``DATABASE_URL``'s (it needs
the CREATEDB right) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_outcomes_export.py [--rows 1000000]

Prints one line of JSON last; exits 1 when a target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time

import psycopg
from scratch_db import scratch_names, with_database

SECONDS_TARGET = 15.0
PEAK_MB_TARGET = 200.0
ROOT = Path(__file__).resolve().parents[1]


def populate(rows: int) -> None:
    """Work items, deletion requests and attempts, written by set-based SQL."""
    import datetime as dt

    from django.db import connection

    from integrations.models import DropCycle, Integration, IntegrationKind, ReportFile
    from integrations.services.staff.brokers import broker_create

    broker = broker_create(broker_id="4821", name="Bench", actor="bench")
    integration = Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.WEBHOOK,
        name="bench webhook",
        url="https://broker.example/drop",
        webhook_secret="whsec_" + "x" * 43,
    )
    downloaded = dt.datetime(2026, 3, 12, 9, tzinfo=dt.UTC)
    cycle = DropCycle.objects.create(
        broker=broker,
        drop_session_id="1",
        zip_name="20260312_4821_DROP.zip",
        zip_sha256="0" * 64,
        downloaded_at=downloaded,
        match_date=downloaded.date(),
        due_date=downloaded.date() + dt.timedelta(days=45),
    )
    report_file = ReportFile.objects.create(
        broker=broker,
        cycle=cycle,
        kind="upload",
        file_name="20260312_4821_Email.csv",
        rows=rows,
        sha256="0" * 64,
        content=b"",
        state="accepted",
    )
    params = {
        "broker": broker.pk,
        "cycle": cycle.pk,
        "file": report_file.pk,
        "integration": integration.pk,
        "rows": rows,
        "at": downloaded,
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO integrations_workitem (broker_id, cycle_id, work_item_id, hash_type,"
            " hash, file_name, state, status_code, status_reason, reported_status_code,"
            " reported_at, report_file_id, needs_amendment, created_at, updated_at)"
            " SELECT %(broker)s, %(cycle)s, lpad(to_hex(g), 12, '0'), 'email',"
            "  sha256(g::text::bytea), '20260312_4821_Email.csv', 'reported',"
            "  (ARRAY[3, 5, 4, 2])[g %% 4 + 1], '', (ARRAY[3, 5, 4, 2])[g %% 4 + 1],"
            "  %(at)s + interval '3 days', %(file)s, false, %(at)s, %(at)s"
            " FROM generate_series(1, %(rows)s) g",
            params,
        )
        cursor.execute(
            "INSERT INTO integrations_deletionrequest (state, attempts, next_attempt_at,"
            " last_error, created_at, dispatched_at, completed_at, request_uuid,"
            " webhook_request_id, results_token, broker_id, work_item_id, consumer_id,"
            " integration_id, isi_connection_id, identifier_hash, hash_type, drop_session_id,"
            " match_date, broker_id_code, mode, remote_identifier, remote_identifier_kind,"
            " late_match, matched_at, drop_outcome, drop_status_code, error_message)"
            " SELECT CASE WHEN w.id %% 50 = 0 THEN 'failed' ELSE 'completed' END,"
            "  CASE WHEN w.id %% 20 = 0 THEN 3 ELSE 1 END, NULL, '', %(at)s,"
            "  %(at)s + CASE WHEN w.id %% 20 = 0 THEN interval '35 minutes'"
            "  ELSE interval '5 seconds' END, %(at)s + interval '1 day',"
            "  gen_random_uuid(), gen_random_uuid(), NULL, %(broker)s, w.id, NULL,"
            "  %(integration)s, NULL, encode(w.hash, 'base64'), 'email', '1', %(at)s::date,"
            "  '4821', 'test', 'customer-' || w.id, 'external_id', w.id %% 97 = 0, %(at)s,"
            "  CASE WHEN w.id %% 50 = 0 THEN 'failed' ELSE (ARRAY['deleted', 'not_found',"
            "  'opted_out', 'exempt'])[w.id %% 4 + 1] END,"
            "  CASE WHEN w.id %% 50 = 0 THEN NULL ELSE w.status_code END,"
            "  CASE WHEN w.id %% 50 = 0 THEN '=HYPERLINK(\"crm\"), timeout' ELSE '' END"
            " FROM integrations_workitem w WHERE w.cycle_id = %(cycle)s",
            params,
        )
        # One attempt each; every 20th request needed three (503, 503, then 200).
        cursor.execute(
            "INSERT INTO integrations_deliveryattempt (deletion_request_id, number, started_at,"
            " url, request_headers, status, duration_ms, response_body, error)"
            " SELECT d.id, n, d.matched_at + (ARRAY[interval '5 seconds', interval '5 minutes',"
            "  interval '35 minutes'])[n], 'https://broker.example/drop', '{}',"
            "  CASE WHEN n = d.attempts THEN 200 ELSE 503 END, 42, '', ''"
            " FROM integrations_deletionrequest d, generate_series(1, d.attempts) n"
        )
        cursor.execute("ANALYZE")


def export_once(database_url: str, out: Path) -> dict[str, float | int]:
    env = {**os.environ, "DATABASE_URL": database_url}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run(  # noqa: S603
        [sys.executable, str(ROOT / "manage.py"), "outcomes", "export", "--out", str(out)],
        check=True,
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with out.open("rb") as exported:
        lines = sum(1 for _ in exported)
    return {
        "seconds": seconds,
        # ru_maxrss of children is the largest child so far: compare with what came before.
        "peak_mb": peak_kb / 1024 if peak_kb > before else before / 1024,
        "rows": lines - 1,
        "csv_mb": out.stat().st_size / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates a scratch database next to it)")
        return 2
    admin_url, name = scratch_names(base_url, "bench_outcomes")
    scratch_url = with_database(base_url, name)
    os.environ["DATABASE_URL"] = scratch_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    runs: list[dict[str, float | int]] = []
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        populate(args.rows)
        print(json.dumps({"populated_seconds": round(time.perf_counter() - started, 1)}))
        connection.close()
        with tempfile.TemporaryDirectory() as directory:
            for repeat in range(args.repeats):
                runs.append(export_once(scratch_url, Path(directory) / "outcomes.csv"))
                print(json.dumps({"run": repeat + 1, **runs[-1]}), flush=True)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    best = min(runs, key=lambda run: run["seconds"])
    peak = max(float(run["peak_mb"]) for run in runs)
    rows_ok = all(run["rows"] == args.rows for run in runs)
    result = {
        "name": "outcomes_export",
        "rows": args.rows,
        "format": "csv",
        "seconds": round(float(best["seconds"]), 2),
        "rows_per_second": round(args.rows / float(best["seconds"])),
        "peak_mb": round(peak, 1),
        "csv_mb": round(float(best["csv_mb"]), 1),
        "seconds_target": SECONDS_TARGET,
        "peak_mb_target": PEAK_MB_TARGET,
        "rows_correct": rows_ok,
        "target_met": rows_ok
        and float(best["seconds"]) <= SECONDS_TARGET
        and peak < PEAK_MB_TARGET,
    }
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
