"""Benchmark: queue a day's recurring deletion rounds for 1,000,000 deleted consumers.

One cycle of 1,000,000 work items, each matched by one consumer, deleted (status 3) 45 days
ago: every one is due for its first recurring round today. ``recurring_rounds_send`` - what
the worker's hourly job and ``drop recurring`` run - reads the schedule, creates a round of
requests through the match's bulk path (one per consumer and webhook target) and defers
their delivery jobs, in batches of ``ROUND_BATCH_ITEMS`` work items, each its own transaction
(``--batch-items -1``: all in one, as before batches).

Target: 60 seconds or less. Best of ``--repeats`` runs, each on a fresh copy of the same
database. Checked each run: one round-1 request per item, queued, with the match's session
and match date, every one held by a delivery job, no work item's status changed. Sending
them then goes at the delivery loop's usual rate (``bench_dispatch.py``): a round's request
is a request like any other.

Everything happens in scratch databases created next to ``DATABASE_URL``'s (it needs the
CREATEDB right) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_recurring.py [--items 1000000] [--repeats 3]

Two more figures, timed on the populated data before the runs, best of ``--repeats``:

- ``count_seconds``: the worker's count of every broker's rounds for the dashboard
  (``recurring_counts_store``, every 5 minutes: ``recurring_overviews``'s read of the whole
  schedule, and one row per broker written). Reported, no target: it grows with the items
  owed rounds, and no one waits for it. Checked: every item counted due.
- ``overview_seconds``: the dashboard's read of those stored counts
  (``recurring_overviews_counted``), what a page waits for. Target:
  ``OVERVIEW_SECONDS_TARGET``, whatever ``--items`` (a row per broker). Checked: the counts
  the job stored, counted at the job's time.

Prints one line of JSON last; exits 1 when a target is missed.
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

SECONDS_TARGET = 60.0
# Staff's landing page (and the stuck check, every 5 minutes) waits for this read: a pass
# over every request of every item owed rounds, so it grows with them. 3 s at a million is
# a slow page already, and what a page load can stand on these 2 cores with some margin.
OVERVIEW_SECONDS_TARGET = 3.0
OVERVIEW_TARGET_ITEMS = 1_000_000
OVERVIEW_START_SECONDS = 0.1  # a statement's own cost, whatever the items


def switch_database(url: str) -> None:
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = urlsplit(url).path.lstrip("/")


def populate(items: int) -> None:
    import datetime as dt

    from django.db import connection

    from integrations.models import DropCycle
    from integrations.services.staff.brokers import broker_create
    from integrations.services.staff.integrations import webhook_integration_create

    broker = broker_create(broker_id="4821", name="Bench", actor="bench")
    integration = webhook_integration_create(
        broker=broker, name="CRM", url="https://crm.example/drop", actor="bench"
    ).integration
    downloaded = dt.datetime.now(dt.UTC) - dt.timedelta(days=50)
    answered = dt.datetime.now(dt.UTC) - dt.timedelta(days=46)
    cycle = DropCycle.objects.create(
        broker=broker,
        drop_session_id="1",
        zip_name="bench_4821_DROP.zip",
        zip_sha256="0" * 64,
        downloaded_at=downloaded,
        match_date=downloaded.date(),
        due_date=downloaded.date() + dt.timedelta(days=45),
        work_items=items,
    )
    params = {
        "broker": broker.pk,
        "cycle": cycle.pk,
        "integration": integration.pk,
        "items": items,
        "at": downloaded,
        "answered": answered,
        "match_date": downloaded.date(),
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO integrations_workitem (id, broker_id, cycle_id, work_item_id, hash_type,"
            " hash, file_name, state, status_code, status_reason, needs_amendment,"
            " created_at, updated_at)"
            " SELECT g, %(broker)s, %(cycle)s, lpad(to_hex(g), 12, '0'), 'email',"
            "  sha256(g::text::bytea), 'bench_4821_Email.csv', 'reportable', 3, '', false,"
            "  %(at)s, %(at)s"
            " FROM generate_series(1, %(items)s) g",
            params,
        )
        cursor.execute(
            "INSERT INTO integrations_consumer (id, broker_id, remote_identifier,"
            " remote_identifier_kind, created_at)"
            " SELECT g, %(broker)s, 'C-' || g, 'external_id', %(at)s"
            " FROM generate_series(1, %(items)s) g",
            params,
        )
        cursor.execute(
            "INSERT INTO integrations_deletionrequest (state, attempts, last_error,"
            " created_at, dispatched_at, completed_at, request_uuid, webhook_request_id,"
            " broker_id, work_item_id, consumer_id, integration_id, identifier_hash,"
            " hash_type, drop_session_id, match_date, broker_id_code, mode, remote_identifier,"
            " remote_identifier_kind, late_match, round, matched_at, drop_outcome,"
            " drop_status_code, error_message)"
            " SELECT 'completed', 1, '', %(at)s, %(at)s, %(answered)s, gen_random_uuid(),"
            "  gen_random_uuid(), %(broker)s, g, g, %(integration)s,"
            "  encode(sha256(g::text::bytea), 'base64'), 'email', '1', %(match_date)s, '4821',"
            "  'test', 'C-' || g, 'external_id', false, 0, %(at)s, 'deleted', 3, ''"
            " FROM generate_series(1, %(items)s) g",
            params,
        )
        for table in ("integrations_workitem", "integrations_consumer"):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %(items)s)",
                params,
            )
        cursor.execute("ANALYZE")


def time_count(items: int, repeats: int) -> tuple[float, bool]:
    """Best time of the worker's count (``recurring_counts_store``), and whether every run
    stored each item due and nothing else."""
    from integrations.models import RecurringCounts
    from integrations.services.cycle.recurring_counts import recurring_counts_store

    times: list[float] = []
    correct = True
    for _ in range(max(repeats, 1)):
        started = time.perf_counter()
        counted = recurring_counts_store()
        times.append(time.perf_counter() - started)
        rows = [
            (r.due, r.sent, r.answered, r.failing, r.overdue) for r in RecurringCounts.objects.all()
        ]
        correct = correct and counted == 1 and rows == [(items, 0, 0, 0, 0)]
    return min(times), correct


def time_overview(items: int, repeats: int) -> tuple[float, bool]:
    """Best time of the dashboard's read of the stored counts, and whether every run found
    them fresh, as the job stored them."""
    from django.utils import timezone

    from integrations.models import Broker
    from integrations.selectors.recurring import recurring_overviews_counted

    broker_pks = list(Broker.objects.values_list("pk", flat=True))
    times: list[float] = []
    correct = True
    for _ in range(max(repeats, 1)):
        started = time.perf_counter()
        overviews = recurring_overviews_counted(broker_pks=broker_pks, now=timezone.now())
        times.append(time.perf_counter() - started)
        counts = [
            (o.due, o.sent, o.answered, o.failing, o.overdue, o.counted_at is not None)
            for o in (overviews or {}).values()
        ]
        correct = correct and counts == [(items, 0, 0, 0, 0, True)]
    return min(times), correct


def run_once(items: int, batch_items: int) -> dict[str, float | int | bool]:
    from django.db import connection

    from integrations.models import Broker, DeletionRequest, WorkItem
    from integrations.services.cycle.recurring import recurring_rounds_send

    broker = Broker.objects.get(broker_id="4821")
    started = time.perf_counter()
    sent = recurring_rounds_send(broker=broker, actor="bench", batch_items=batch_items)
    done = time.perf_counter()
    round_one = DeletionRequest.objects.filter(round=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(jsonb_array_length(args -> 'request_ids')), 0)"
            " FROM procrastinate_jobs WHERE task_name = %s",
            ["integrations.tasks.deliver_deletion_requests"],
        )
        held = int(cursor.fetchone()[0])
    correct = (
        sent.work_items == items
        and sent.queued == items
        and round_one.filter(state="queued", drop_session_id="1").count() == items
        and held == items
        and WorkItem.objects.filter(status_code=3).count() == items
        and DeletionRequest.objects.filter(round=0).exclude(state="completed").count() == 0
    )
    return {"seconds": done - started, "requests": sent.deletion_requests, "correct": correct}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--batch-items",
        type=int,
        default=0,
        help="work items per transaction; 0: the service's own (ROUND_BATCH_ITEMS), -1: all in one",
    )
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates scratch databases next to it)")
        return 2
    admin_url, template = scratch_names(base_url, "bench_recurring")
    batch_items = args.batch_items
    os.environ["DATABASE_URL"] = with_database(base_url, template)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    admin_execute(admin_url, f'CREATE DATABASE "{template}"')
    clones: list[str] = []
    runs: list[dict[str, float | int | bool]] = []
    try:
        import django

        django.setup()
        from integrations.services.cycle.recurring import ROUND_BATCH_ITEMS

        if batch_items == 0:
            batch_items = ROUND_BATCH_ITEMS
        elif batch_items < 0:
            batch_items = max(args.items, 1)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        populate(args.items)
        count_seconds, count_correct = time_count(args.items, args.repeats)
        overview_seconds, overview_correct = time_overview(args.items, args.repeats)
        overview_correct = overview_correct and count_correct
        print(
            json.dumps(
                {
                    "count_seconds": round(count_seconds, 2),
                    "overview_seconds": round(overview_seconds, 4),
                }
            ),
            flush=True,
        )
        switch_database(with_database(base_url, "postgres"))  # off the template to clone it
        for repeat in range(args.repeats):
            clone = f"{template}_{repeat}"
            admin_execute(admin_url, f'CREATE DATABASE "{clone}" TEMPLATE "{template}"')
            clones.append(clone)
            switch_database(with_database(base_url, clone))
            runs.append(run_once(args.items, batch_items))
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
    overview_target = OVERVIEW_SECONDS_TARGET
    result = {
        "name": "recurring",
        "work_items": args.items,
        "mode": "a day's recurring rounds queued, one webhook target",
        "batch_items": batch_items,
        "seconds": round(float(best["seconds"]), 2),
        "requests": best["requests"],
        "seconds_target": SECONDS_TARGET,
        "count_seconds": round(count_seconds, 2),
        "overview_seconds": round(overview_seconds, 4),
        "overview_seconds_target": overview_target,
        "overview_target_met": overview_correct and overview_seconds <= overview_target,
        "correct": correct and overview_correct,
        "target_met": correct
        and overview_correct
        and float(best["seconds"]) <= SECONDS_TARGET
        and overview_seconds <= overview_target,
    }
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
