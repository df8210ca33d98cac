"""Benchmark: signed deletion dispatches delivered per second by one worker process.

Queued deletion requests with their delivery jobs (100 requests per job, as matching queues
them) are run by one in-process Procrastinate worker (4 jobs at once, as ``manage.py
worker``), each job delivering on ``DISPATCH_THREADS`` threads: lock, build body §2.1, sign,
POST, record the attempt, update the request, ledger event. The receiver is the loopback
``BrokerSimulator`` in its own process, verifying every signature.

Baseline, same run, same receiver: a plain ``requests.Session`` loop POSTing the same bodies
and headers one after another (no database, no signing).

Targets: 400 deliveries/s or more, and at least 30 % of the plain loop's rate. Best of
``--repeats`` rounds of each.

Everything happens in a scratch database created next to ``DATABASE_URL``'s (it needs the
CREATEDB right) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_dispatch.py [--requests 3000] [--repeats 3]

Prints one line of JSON last; exits 1 when a target is missed.
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
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from scratch_db import admin_execute, scratch_names

RATE_TARGET = 400.0
RATIO_TARGET = 0.3
WORKER_CONCURRENCY = 4


def receiver_process(secret: str, port_pipe: Any, stop: Any) -> None:
    """The broker's webhook endpoint, in its own process so it does not share our GIL."""
    from devtools.broker_simulator import BrokerSimulator

    with BrokerSimulator(secret) as simulator:
        port_pipe.send(simulator.port)
        stop.wait()
        received = simulator.received
        port_pipe.send(
            {"received": len(received), "bad": sum(1 for r in received if not r.signature_ok)}
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=WORKER_CONCURRENCY, help="jobs at once")
    parser.add_argument("--threads", type=int, default=0, help="threads per job (default: ours)")
    args = parser.parse_args()
    base_url = os.environ.get("DATABASE_URL")
    if not base_url:
        print("set DATABASE_URL (a server where a scratch database may be created)")
        return 2
    admin_url, name = scratch_names(base_url, "bench_dispatch")

    from integrations.dispatch import signing

    secret = signing.generate_webhook_secret()
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe()
    stop = context.Event()
    receiver = context.Process(target=receiver_process, args=(secret, child_end, stop))
    receiver.start()
    port = parent_end.recv()

    admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = urlunsplit(urlsplit(base_url)._replace(path=f"/{name}"))
    os.environ["DROPPORTAL_ALLOW_PRIVATE_TARGETS"] = "1"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    try:
        import django

        django.setup()
        result = run(args, secret, f"http://127.0.0.1:{port}/webhook")
    finally:
        from django.db import connections

        connections.close_all()
        admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        stop.set()
        checked = parent_end.recv()
        receiver.join(timeout=10)
    result["receiver"] = checked
    result["target_met"] = bool(result["target_met"] and checked["bad"] == 0)
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


def run(args: argparse.Namespace, secret: str, url: str) -> dict[str, Any]:
    import requests
    from django.core.management import call_command
    from django.db import transaction
    from django.utils import timezone
    from procrastinate.contrib.django import app

    from integrations import enqueue
    from integrations.dispatch import webhook
    from integrations.models import (
        DeletionRequest,
        DropCycle,
        Integration,
        IntegrationKind,
        RequestState,
        WorkItem,
    )
    from integrations.services.dispatch import delivery_loop
    from integrations.services.staff.brokers import broker_create

    call_command("migrate", verbosity=0)
    if args.threads:
        delivery_loop.DISPATCH_THREADS = args.threads
    broker = broker_create(broker_id="4821", name="Bench", actor="bench")
    integration = Integration.objects.create(
        broker=broker, kind=IntegrationKind.WEBHOOK, name="Bench", url=url, webhook_secret=secret
    )
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

    def queue_round() -> list[int]:
        items = WorkItem.objects.bulk_create(
            WorkItem(
                broker=broker,
                cycle=cycle,
                work_item_id=f"B{next(serial):011d}",
                hash_type="email",
                hash=os.urandom(32),
                file_name="bench_Email.csv",
            )
            for _ in range(args.requests)
        )
        with transaction.atomic():
            created = DeletionRequest.objects.bulk_create(
                DeletionRequest(
                    state=RequestState.QUEUED,
                    broker=broker,
                    work_item=item,
                    integration=integration,
                    identifier_hash="KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=",
                    hash_type="email",
                    drop_session_id="1",
                    match_date=today,
                    broker_id_code="4821",
                    mode="test",
                    remote_identifier=f"C-{item.pk}",
                    remote_identifier_kind="external_id",
                )
                for item in items
            )
            ids = [r.pk for r in created]
            enqueue.deletion_requests_enqueue(ids)
        return ids

    def worker_round() -> float:
        ids = queue_round()
        started = time.perf_counter()
        with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
            app.run_worker(
                queues=["dispatch"],
                wait=False,
                concurrency=args.concurrency,
                install_signal_handlers=False,
                listen_notify=False,
            )
        elapsed = time.perf_counter() - started
        delivered = DeletionRequest.objects.filter(
            pk__in=ids, state=RequestState.DISPATCHED
        ).count()
        if delivered != len(ids):
            raise SystemExit(f"only {delivered} of {len(ids)} delivered")
        return len(ids) / elapsed

    # The same bodies and headers the worker sends, built beforehand: the plain loop only posts.
    sample = list(DeletionRequest.objects.select_related("integration")[: args.requests])
    if not sample:
        queue_round()
        sample = list(DeletionRequest.objects.select_related("integration")[: args.requests])
    prepared = []
    for request in sample:
        body = webhook.deletion_dispatch_body(request, integration)
        prepared.append(
            (
                body,
                webhook.webhook_headers(
                    secret, body, webhook_request_id=request.webhook_request_id
                ),
            )
        )

    def plain_round() -> float:
        session = requests.Session()
        started = time.perf_counter()
        for body, headers in prepared:
            response = session.post(url, data=body, headers=headers, timeout=15)
            response.raise_for_status()
        return len(prepared) / (time.perf_counter() - started)

    plain_round()  # warm the receiver's and our connections, and the worker's code paths
    saved, args.requests = args.requests, min(args.requests, 500)
    worker_round()
    args.requests = saved
    worker_rates, plain_rates = [], []
    for _ in range(args.repeats):
        plain_rates.append(plain_round())
        worker_rates.append(worker_round())
    best, baseline = max(worker_rates), max(plain_rates)
    ratio = best / baseline
    return {
        "name": "dispatch",
        "deliveries_per_second": round(best, 1),
        "baseline": "plain requests.Session loop posting the same bodies, same receiver",
        "baseline_per_second": round(baseline, 1),
        "ratio": round(ratio, 3),
        "rounds_per_second": [round(r, 1) for r in worker_rates],
        "baseline_rounds_per_second": [round(r, 1) for r in plain_rates],
        "requests_per_round": args.requests,
        "worker_concurrency": args.concurrency,
        "threads_per_job": delivery_loop.DISPATCH_THREADS,
        "targets": {"deliveries_per_second": RATE_TARGET, "ratio": RATIO_TARGET},
        "target_met": best >= RATE_TARGET and ratio >= RATIO_TARGET,
    }


if __name__ == "__main__":
    sys.exit(main())
