"""Benchmark: a year's evidence pack and DROP metrics for a broker with 5,000,000 work items.

The scratch database holds one broker's year: 8 cycles (one every 45 days) of 5,000,000
work items in all, in two lists. One in ten matched a consumer and has a deletion request
with its outcome (deleted, opted out, exempt, not found, in turns); every work item was
reported to DROP 1 to 40 days after its download, in one accepted response file per cycle
and list, built like the real ones. The ledger holds what the services write for that:
per cycle the import and the requests, per match the outcome and the work item's
settlement, per file its writing and DROP's answer, hashed by the database's own function
and chained like ``ledger_seal`` does. Everything is written with set-based SQL and COPY.

Then, each as the real command in a child process (its time includes starting Django; its
peak memory is the child's maximum RSS):

- ``evidence export --broker 4821 --since Y-01-01 --until Y-12-31 --sample 25 --seed bench
  --out pack.zip`` (the audit's components and a sample of 25 stories included)
- ``drop metrics --broker 4821 --year Y --format json``
- ``evidence verify pack.zip`` (no database), for the record

Targets: the export in 300 s and 300 MB, the metrics in 60 s and 200 MB, the pack verifies
and the metrics count every work item. Runs once (``--repeats`` for more; best time kept).

    DATABASE_URL=postgres://... python bench/bench_evidence.py [--items 5000000]

Prints one line of JSON last; exits 1 when a target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import datetime as dt
import json
import os
import subprocess
import tempfile
import time
from typing import Any

import psycopg
from scratch_db import scratch_names, with_database

EXPORT_SECONDS_TARGET = 300.0
EXPORT_MB_TARGET = 300.0
METRICS_SECONDS_TARGET = 60.0
METRICS_MB_TARGET = 200.0
ROOT = Path(__file__).resolve().parents[1]
YEAR = 2026
CYCLES = 8
LISTS = (("Email", "email"), ("Phone", "phone"))

# The event data below is canonical JSON (keys sorted), as ledger_append.sql expects.
_EVENTS_SQL = """
INSERT INTO integrations_ledgerevent (created_at, broker_id, kind, subject, actor, data, event_hash)
SELECT at, '4821', kind, subject, 'system', data::jsonb,
       dropportal_ledger_event_hash(at, '4821', kind, subject, 'system', data)
FROM ({select}) AS e (at, kind, subject, data) ORDER BY at
"""
_CYCLE_EVENTS = """
SELECT c.downloaded_at + interval '1 minute', 'drop.cycle_imported', c.drop_session_id,
       '{"drop_session_id":' || to_json(c.drop_session_id) || ',"matched":' || c.matched
       || ',"not_found":' || c.not_found || ',"work_items":' || c.work_items || '}'
FROM integrations_dropcycle c
"""
_OUTCOME_EVENTS = """
SELECT d.completed_at, 'deletion_request.outcome_recorded', d.request_uuid::text,
       '{"drop_outcome":' || to_json(d.drop_outcome) || ',"drop_status_code":'
       || d.drop_status_code || ',"previous_outcome":"","previous_state":"dispatched"}'
FROM integrations_deletionrequest d
UNION ALL
SELECT d.completed_at + interval '1 millisecond', 'work_item.status_settled', w.work_item_id,
       '{"cycle":' || to_json(d.drop_session_id) || ',"needs_amendment":false,'
       || '"previous_status_code":null,"state":"reportable","status_code":'
       || w.status_code || '}'
FROM integrations_deletionrequest d JOIN integrations_workitem w ON w.id = d.work_item_id
"""
_FILE_EVENTS = """
SELECT f.created_at, 'report_file.written', f.file_name,
       '{"cycle":' || to_json(c.drop_session_id) || ',"file_name":' || to_json(f.file_name)
       || ',"kind":"upload","list":"x","rows":' || f.rows || ',"sha256":"' || f.sha256 || '"}'
FROM integrations_reportfile f JOIN integrations_dropcycle c ON c.id = f.cycle_id
UNION ALL
SELECT f.uploaded_at, 'report_file.accepted', f.file_name,
       '{"cycle":' || to_json(c.drop_session_id) || ',"drop_response":'
       || '{"attempts":1,"endpoint":"/data/upload","message":"accepted","status":202}'
       || ',"file_name":' || to_json(f.file_name) || ',"kind":"upload","rows":' || f.rows
       || ',"sha256":"' || f.sha256 || '"}'
FROM integrations_reportfile f JOIN integrations_dropcycle c ON c.id = f.cycle_id
"""


def populate(items: int) -> None:
    from django.db import connection

    from integrations.models import DropCycle, Integration, IntegrationKind, ReportFile
    from integrations.services.staff.brokers import broker_create

    # In production: the yearly figures measured count its cycles (production ones).
    broker = broker_create(broker_id="4821", name="Bench", mode="production", actor="bench")
    integration = Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.WEBHOOK,
        name="bench webhook",
        url="https://broker.example/drop",
        webhook_secret="whsec_" + "x" * 43,
    )
    per_cycle = items // CYCLES
    first = dt.datetime(YEAR, 1, 5, 9, tzinfo=dt.UTC)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        for number in range(CYCLES):
            downloaded = first + dt.timedelta(days=45 * number)
            count = per_cycle if number < CYCLES - 1 else items - per_cycle * (CYCLES - 1)
            cycle = DropCycle.objects.create(
                broker=broker,
                drop_session_id=str(number + 1),
                zip_name=f"{downloaded:%Y%m%d}_4821_DROP.zip",
                zip_sha256=f"{number:064x}",
                downloaded_at=downloaded,
                match_date=downloaded.date(),
                due_date=downloaded.date() + dt.timedelta(days=45),
                state="reported",
                work_items=count,
                matched=count // 10,
                not_found=count - count // 10,
            )
            params = {
                "broker": broker.pk,
                "cycle": cycle.pk,
                "count": count,
                "at": downloaded,
                "prefix": f"{number + 1:02d}",
                "integration": integration.pk,
                "session": cycle.drop_session_id,
            }
            # The response files first (filled in below), so each item names its file as
            # it is written.
            files = {}
            for list_name, hash_type in LISTS:
                files[hash_type] = ReportFile.objects.create(
                    broker=broker,
                    cycle=cycle,
                    kind="upload",
                    file_name=f"{downloaded:%Y%m%d}_4821_{list_name}.csv",
                    rows=0,
                    sha256="",
                    content=b"",
                    state="accepted",
                    drop_response={
                        "status": 202,
                        "endpoint": "/data/upload",
                        "message": "accepted",
                        "attempts": 1,
                    },
                ).pk
            params["email_file"], params["phone_file"] = files["email"], files["phone"]
            # Every 10th item matched: its code by its outcome; the rest not found (5).
            cursor.execute(
                "INSERT INTO integrations_workitem (broker_id, cycle_id, work_item_id,"
                " hash_type, hash, file_name, state, status_code, status_reason,"
                " reported_status_code, reported_at, report_file_id, needs_amendment,"
                " created_at, updated_at)"
                " SELECT %(broker)s, %(cycle)s, %(prefix)s || lpad(to_hex(g), 10, '0'),"
                "  CASE WHEN g %% 3 = 0 THEN 'phone' ELSE 'email' END,"
                "  sha256((%(prefix)s || g)::bytea), '', 'reported', code, '', code,"
                "  %(at)s + make_interval(days => 1 + g %% 40, secs => g %% 86400),"
                "  CASE WHEN g %% 3 = 0 THEN %(phone_file)s ELSE %(email_file)s END, false,"
                "  %(at)s, %(at)s"
                " FROM generate_series(1, %(count)s) g,"
                "  LATERAL (SELECT CASE WHEN g %% 10 = 0 THEN (ARRAY[3, 4, 2, 5])[g / 10 %% 4 + 1]"
                "   ELSE 5 END AS code) s",
                params,
            )
            cursor.execute(
                "INSERT INTO integrations_deletionrequest (state, attempts, last_error,"
                " created_at, dispatched_at, completed_at, request_uuid, webhook_request_id,"
                " broker_id, work_item_id, integration_id, identifier_hash, hash_type,"
                " drop_session_id, match_date, broker_id_code, mode, remote_identifier,"
                " remote_identifier_kind, late_match, matched_at, drop_outcome,"
                " drop_status_code, error_message)"
                " SELECT 'completed', 1, '', %(at)s, %(at)s + interval '5 seconds',"
                "  %(at)s + interval '1 hour' + make_interval(secs => w.id %% 3600),"
                "  gen_random_uuid(), gen_random_uuid(), %(broker)s, w.id, %(integration)s,"
                "  encode(w.hash, 'base64'), w.hash_type, %(session)s, %(at)s::date, '4821',"
                "  'test', 'customer-' || w.id, 'external_id', false, %(at)s,"
                "  (ARRAY['deleted', 'opted_out', 'exempt', 'not_found'])[array_position("
                "   ARRAY[3, 4, 2, 5], w.status_code::int)], w.status_code, ''"
                " FROM integrations_workitem w"
                " WHERE w.cycle_id = %(cycle)s AND right(w.work_item_id, 10) IN ("
                "  SELECT lpad(to_hex(g), 10, '0') FROM generate_series(10, %(count)s, 10) g)",
                params,
            )
            cursor.execute(
                "UPDATE integrations_reportfile f SET rows = b.rows, content = b.content,"
                "  created_at = %(at)s + interval '41 days', uploaded_at = %(at)s"
                "  + interval '41 days'"
                " FROM (SELECT report_file_id, count(*) AS rows, convert_to('Id,Status'"
                "  || E'\\r\\n' || string_agg(work_item_id || ',' || reported_status_code,"
                "  E'\\r\\n' ORDER BY work_item_id) || E'\\r\\n', 'UTF8') AS content"
                "  FROM integrations_workitem WHERE cycle_id = %(cycle)s"
                "  GROUP BY report_file_id) b WHERE f.id = b.report_file_id",
                params,
            )
        cursor.execute("UPDATE integrations_reportfile SET sha256 = encode(sha256(content), 'hex')")
        union = " UNION ALL ".join([_CYCLE_EVENTS, _OUTCOME_EVENTS, _FILE_EVENTS])
        cursor.execute(_EVENTS_SQL.format(select=union))
    seal()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def seal() -> None:
    """Chain every event as ``ledger_seal`` does (same hash rule), written with COPY."""
    from django.db import connection

    from integrations.ledger_hash import GENESIS_HASH, chain_hash

    previous = GENESIS_HASH
    links = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        horizon = int(cursor.fetchone()[0])
        cursor.execute("SELECT id, event_hash FROM integrations_ledgerevent ORDER BY id")
        for event_id, content in cursor.fetchall():
            previous = chain_hash(previous, event_id, content)
            links.append((event_id, previous))
        with cursor.copy(
            "COPY integrations_ledgerchainlink (event_id, chain_hash, sealed_at, horizon_txid)"
            " FROM STDIN"
        ) as copy:
            now = dt.datetime.now(dt.UTC)
            for event_id, link in links:
                copy.write_row((event_id, link, now, horizon))


# The child reports its own peak (VmHWM, the high-water mark of its memory since exec): a
# forked child's ru_maxrss starts at this bench's own size, which would hide the child's.
_PEAK_WRAPPER = """
import atexit, runpy, sys
peak_file, path, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]
def peak():
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith('VmHWM:'):
                open(peak_file, 'w').write(line.split()[1])
atexit.register(peak)
runpy.run_path(path, run_name='__main__')
"""


def child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``manage.py args``; its time, its own peak RSS and its output."""
    with tempfile.TemporaryDirectory() as directory:
        peak_file = Path(directory) / "peak"
        started = time.perf_counter()
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-c", _PEAK_WRAPPER, str(peak_file), str(ROOT / "manage.py"), *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(args[:2])} failed: {done.stderr[-2000:]}")
        return {
            "seconds": round(seconds, 1),
            "peak_mb": round(int(peak_file.read_text()) / 1024, 1),
            "stdout": done.stdout,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=5_000_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates a scratch database next to it)")
        return 2
    admin_url, name = scratch_names(base_url, "bench_evidence")
    scratch_url = with_database(base_url, name)
    os.environ["DATABASE_URL"] = scratch_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    exports: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        populate(args.items)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM integrations_ledgerevent")
            events = cursor.fetchone()[0]
        print(
            json.dumps(
                {"populated_seconds": round(time.perf_counter() - started, 1), "events": events}
            ),
            flush=True,
        )
        connection.close()
        env = {**os.environ, "DATABASE_URL": scratch_url}
        with tempfile.TemporaryDirectory() as directory:
            pack = Path(directory) / "pack.zip"
            export_args = ["evidence", "export", "--broker", "4821", "--out", str(pack)]
            export_args += ["--since", f"{YEAR}-01-01", "--until", f"{YEAR}-12-31"]
            export_args += ["--sample", "25", "--seed", "bench"]
            metrics_args = ["drop", "metrics", "--broker", "4821", "--year", str(YEAR)]
            metrics_args += ["--format", "json"]
            for repeat in range(args.repeats):
                exports.append(child(export_args, env))
                metrics.append(child(metrics_args, env))
                shown = {k: v for k, v in metrics[-1].items() if k != "stdout"}
                print(
                    json.dumps({"run": repeat + 1, "export": exports[-1], "metrics": shown}),
                    flush=True,
                )
            pack_mb = pack.stat().st_size / 1e6
            offline = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
            verified = child(["evidence", "verify", str(pack)], offline)
    finally:
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(json.dumps({"kept_database": name}), flush=True)
        else:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    figures = json.loads(str(metrics[-1]["stdout"]))["total"]
    counted = figures["received"] == args.items and figures["matched"] == args.items // 10
    best_export = min(exports, key=lambda run: run["seconds"])
    best_metrics = min(metrics, key=lambda run: run["seconds"])
    export_peak = max(run["peak_mb"] for run in exports)
    metrics_peak = max(run["peak_mb"] for run in metrics)
    result = {
        "name": "evidence",
        "work_items": args.items,
        "ledger_events": events,
        "export_seconds": best_export["seconds"],
        "export_peak_mb": export_peak,
        "pack_mb": round(pack_mb, 1),
        "metrics_seconds": best_metrics["seconds"],
        "metrics_peak_mb": metrics_peak,
        "verify_seconds": verified["seconds"],
        "verify_peak_mb": verified["peak_mb"],
        "median_days": figures["median_days"],
        "mean_days": figures["mean_days"],
        "metrics_count_every_item": counted,
        "targets": {
            "export_seconds": EXPORT_SECONDS_TARGET,
            "export_peak_mb": EXPORT_MB_TARGET,
            "metrics_seconds": METRICS_SECONDS_TARGET,
            "metrics_peak_mb": METRICS_MB_TARGET,
        },
        "target_met": counted
        and best_export["seconds"] <= EXPORT_SECONDS_TARGET
        and export_peak <= EXPORT_MB_TARGET
        and best_metrics["seconds"] <= METRICS_SECONDS_TARGET
        and metrics_peak <= METRICS_MB_TARGET,
    }
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
