"""Benchmark: report a cycle of 1,000,000 work items to a loopback DROP.

One cycle, six lists (NDZ, Email, Phone, MAID, NameVIN, CTVID) sharing 1,000,000 work
items, every one reportable with a status. ``report_run(upload=True)`` - what
``drop report --upload`` and the periodic job run - writes the six response files (each
work item pointed at its file in the same transaction) and uploads them to a
``DropSimulator`` on 127.0.0.1 through the real ``DropClient`` (multipart, 202 answers).

Target: 30 seconds or less for writing and uploading. Best of ``--repeats`` runs, each on a
fresh copy of the same database. Checked each run: six files accepted, their rows add up
to the cycle, DROP received exactly the stored bytes, every work item is reported.

Everything happens in scratch databases created next to ``DATABASE_URL``'s (it needs the
CREATEDB right) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_report.py [--items 1000000] [--repeats 3]

Prints one line of JSON last; exits 1 when the target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import time
from urllib.parse import urlsplit

from scratch_db import admin_execute, scratch_names, with_database

SECONDS_TARGET = 30.0
KEY = "bench-drop-key"
LISTS = {"NDZ": "ndz", "Email": "email", "Phone": "phone", "MAID": "maid"}
LISTS |= {"NameVIN": "name_vin", "CTVID": "ctvid"}


def switch_database(url: str) -> None:
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = urlsplit(url).path.lstrip("/")


def populate(items: int) -> None:
    import datetime as dt

    from django.db import connection

    from integrations.models import DropCycle
    from integrations.services.staff.brokers import broker_create

    broker = broker_create(broker_id="4821", name="Bench", drop_api_key=KEY, actor="bench")
    downloaded = dt.datetime(2026, 3, 12, 9, tzinfo=dt.UTC)
    cycle = DropCycle.objects.create(
        broker=broker,
        drop_session_id="1",
        zip_name="20260312_4821_DROP.zip",
        zip_sha256="0" * 64,
        downloaded_at=downloaded,
        match_date=downloaded.date(),
        due_date=downloaded.date() + dt.timedelta(days=45),
        work_items=items,
    )
    names = list(LISTS)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO integrations_workitem (broker_id, cycle_id, work_item_id, hash_type,"
            " hash, file_name, state, status_code, status_reason, needs_amendment,"
            " created_at, updated_at)"
            " SELECT %(broker)s, %(cycle)s, lpad(to_hex(g), 12, '0'),"
            "  (%(types)s::text[])[g %% 6 + 1], sha256(g::text::bytea),"
            "  '20260312_4821_' || (%(names)s::text[])[g %% 6 + 1] || '.csv', 'reportable',"
            "  CASE WHEN g %% 10 = 0 THEN 3 WHEN g %% 97 = 0 THEN 4 ELSE 5 END, '', false,"
            "  %(at)s, %(at)s"
            " FROM generate_series(1, %(items)s) g",
            {
                "broker": broker.pk,
                "cycle": cycle.pk,
                "types": [LISTS[name] for name in names],
                "names": names,
                "items": items,
                "at": downloaded,
            },
        )
        cursor.execute("ANALYZE")


def run_once(items: int) -> dict[str, float | int | bool]:
    from devtools.drop_simulator import DropSimulator
    from integrations.drop.client import DropClient, DropLimits
    from integrations.models import Broker, ReportFile, WorkItem, WorkItemState
    from integrations.services.reporting.report_files import report_files_write
    from integrations.services.reporting.report_uploads import report_files_upload

    broker = Broker.objects.get(broker_id="4821")
    with DropSimulator(api_key=KEY, broker_id="4821", active_download=True) as drop:
        client = DropClient(drop.url, KEY, limits=DropLimits(read_timeout=120), allow_private=True)
        started = time.perf_counter()
        written = report_files_write(broker=broker, actor="bench")
        wrote = time.perf_counter()
        run = report_files_upload(broker=broker, client=client, actor="bench")
        done = time.perf_counter()
        stored = dict(ReportFile.objects.values_list("file_name", "content"))
        received = dict(drop.uploaded)
    rows = sum(f.rows for f in written)
    correct = (
        len(written) == len(LISTS)
        and run.error is None
        and len(run.accepted) == len(LISTS)
        and rows == items
        and all(bytes(content) == received.get(name) for name, content in stored.items())
        and sum(content.count(b"\n") - 1 for content in received.values()) == items
        and not WorkItem.objects.exclude(state=WorkItemState.REPORTED).exists()
    )
    return {
        "seconds": done - started,
        "write_seconds": wrote - started,
        "upload_seconds": done - wrote,
        "files": len(written),
        "rows": rows,
        "upload_mb": sum(len(c) for c in received.values()) / 1e6,
        "correct": correct,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates scratch databases next to it)")
        return 2
    admin_url, template = scratch_names(base_url, "bench_report")
    os.environ["DATABASE_URL"] = with_database(base_url, template)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    admin_execute(admin_url, f'CREATE DATABASE "{template}"')
    clones: list[str] = []
    runs: list[dict[str, float | int | bool]] = []
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        populate(args.items)
        switch_database(with_database(base_url, "postgres"))  # off the template to clone it
        for repeat in range(args.repeats):
            clone = f"{template}_{repeat}"
            admin_execute(admin_url, f'CREATE DATABASE "{clone}" TEMPLATE "{template}"')
            clones.append(clone)
            switch_database(with_database(base_url, clone))
            runs.append(run_once(args.items))
            print(json.dumps({"run": repeat + 1, **runs[-1]}), flush=True)
            switch_database(with_database(base_url, "postgres"))
            admin_execute(admin_url, f'DROP DATABASE "{clone}"')
            clones.remove(clone)
    finally:
        from django.db import connections

        connections.close_all()
        for name in [*clones, template]:
            admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    best = min(runs, key=lambda run: float(run["seconds"]))
    correct = all(bool(run["correct"]) for run in runs)
    result = {
        "name": "report",
        "work_items": args.items,
        "mode": "write and upload to a loopback DropSimulator",
        "seconds": round(float(best["seconds"]), 2),
        "write_seconds": round(float(best["write_seconds"]), 2),
        "upload_seconds": round(float(best["upload_seconds"]), 2),
        "files": best["files"],
        "upload_mb": round(float(best["upload_mb"]), 1),
        "seconds_target": SECONDS_TARGET,
        "correct": correct,
        "target_met": correct and float(best["seconds"]) <= SECONDS_TARGET,
    }
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
