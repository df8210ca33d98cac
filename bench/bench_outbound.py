"""Benchmark: unauthenticated callbacks leave the ledger alone; slow targets are cut off.

1. 10,000 callbacks without a valid API key (no key, made-up keys, bodies over 64 KiB),
   through the Django test client (the whole middleware and DRF stack, no network): from 4
   client addresses with the per-address throttle at its default (most are throttled), and
   from 100 with it off (every one reaches the key lookup). Checked: not one ledger event
   is added, every one is counted, and what they were answered (401/413, 429 once an
   address is throttled).
2. A loopback target that trickles its response headers one byte a second (a complete
   answer would take 40 s): one call each through ``outbound_http.deliver`` (webhooks,
   ISI, OAuth, SaaS) and the DROP client, with a 2 s total timeout. Checked: each ends
   with a timeout, how long after its start, and the target saw the connection closed.

Target: no ledger event from the 20,000 callbacks; every trickled call ends within 1 s of
its timeout. Runs in a scratch database created next to ``DATABASE_URL``'s (it needs the
CREATEDB right), dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_outbound.py [--callbacks 10000]

Prints one line of JSON last; exits 1 when the target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from typing import Any

from scratch_db import admin_execute, scratch_names, with_database

TIMEOUT = 2.0
SLACK = 1.0  # how far past its timeout a call may end
ADDRESSES = {True: 4, False: 100}  # throttled or not


def callbacks(count: int, *, throttled: bool) -> dict[str, Any]:
    from django.conf import settings
    from django.core.cache import caches
    from django.test import Client

    from integrations.models import LedgerEvent
    from integrations.services.dispatch import callback_rejections

    settings.DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT = 5.0 if throttled else 0
    caches[settings.CALLBACK_THROTTLE_CACHE].clear()
    client = Client()
    body = json.dumps({"schema_version": "1.0", "status": "completed"}).encode()
    too_big = b'{"x": "' + b"a" * (65 * 1024) + b'"}'
    events = LedgerEvent.objects.count()
    counted = callback_rejections.UNAUTHENTICATED.count
    statuses: Counter[int] = Counter()
    started = time.perf_counter()
    for n in range(count):
        headers: dict[str, str] = {"REMOTE_ADDR": f"198.51.100.{n % ADDRESSES[throttled]}"}
        if n % 3:
            headers["HTTP_AUTHORIZATION"] = f"Bearer dpk_guess{n:08d}"
        payload = too_big if n % 10 == 9 else body
        response = client.put(
            "/api/v1/drop/callbacks/deletion",
            data=payload,
            content_type="application/json",
            **headers,  # type: ignore[arg-type]
        )
        statuses[response.status_code] += 1
    seconds = time.perf_counter() - started
    return {
        "callbacks": count,
        "ledger_events_added": LedgerEvent.objects.count() - events,
        "counted": callback_rejections.UNAUTHENTICATED.count - counted,
        "statuses": dict(sorted(statuses.items())),
        "per_second": round(count / seconds),
    }


def trickled() -> dict[str, Any]:
    from devtools.trickle_server import TrickleServer
    from integrations.drop.client import DropApiError, DropClient, DropLimits
    from integrations.outbound_http import deliver

    results: dict[str, Any] = {}
    with TrickleServer(interval=1.0, header_bytes=40) as server:
        started = time.monotonic()
        result = deliver(
            "POST", server.url, body=b"{}", headers={}, allow_private=True, timeout_total=TIMEOUT
        )
        seconds = time.monotonic() - started
        results["deliver"] = {
            "seconds": round(seconds, 2),
            "error": result.error,
            "target_saw_close": server.cut_off.wait(10),
            "target_sent_bytes": server.bytes_sent,
        }
    with TrickleServer(interval=1.0, header_bytes=40) as server, tempfile.TemporaryDirectory() as d:
        client = DropClient(
            server.url.rstrip("/"),
            "bench-drop-key",
            allow_private=True,
            limits=DropLimits(
                connect_timeout=1, read_timeout=TIMEOUT, total_timeout=TIMEOUT, max_retries=0
            ),
        )
        started = time.monotonic()
        error = ""
        try:
            client.download(d)
        except DropApiError as exc:
            error = str(exc)
        seconds = time.monotonic() - started
        results["drop_client"] = {
            "seconds": round(seconds, 2),
            "error": error,
            "target_saw_close": server.cut_off.wait(10),
            "target_sent_bytes": server.bytes_sent,
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--callbacks", type=int, default=10_000)
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates a scratch database next to it)")
        return 2
    admin_url, name = scratch_names(base_url, "bench_outbound")
    os.environ["DATABASE_URL"] = with_database(base_url, name)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    try:
        import logging

        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        # The refusals are logged once a minute; Django's own line per 4xx is not wanted here.
        logging.getLogger("django.request").setLevel(logging.ERROR)
        settings.ALLOWED_HOSTS = ["*"]
        call_command("migrate", verbosity=0)
        throttled = callbacks(args.callbacks, throttled=True)
        print(json.dumps({"callbacks_throttled": throttled}), flush=True)
        open_ = callbacks(args.callbacks, throttled=False)
        print(json.dumps({"callbacks_unthrottled": open_}), flush=True)
        cut = trickled()
        print(json.dumps({"trickle": cut}), flush=True)
    finally:
        from django.db import connections

        connections.close_all()
        admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    no_events = throttled["ledger_events_added"] == 0 and open_["ledger_events_added"] == 0
    all_counted = throttled["counted"] == open_["counted"] == args.callbacks
    cut_in_time = all(
        call["seconds"] <= TIMEOUT + SLACK and "2 s" in call["error"] and call["target_saw_close"]
        for call in cut.values()
    )
    result = {
        "name": "outbound",
        "callbacks": args.callbacks,
        "ledger_events_added": throttled["ledger_events_added"] + open_["ledger_events_added"],
        "throttled_statuses": throttled["statuses"],
        "unthrottled_statuses": open_["statuses"],
        "throttled_per_second": throttled["per_second"],
        "unthrottled_per_second": open_["per_second"],
        "timeout_seconds": TIMEOUT,
        "deliver_cut_after_seconds": cut["deliver"]["seconds"],
        "drop_client_cut_after_seconds": cut["drop_client"]["seconds"],
        "trickle_complete_answer_seconds": 40,
        "target_met": no_events and all_counted and cut_in_time,
    }
    print(json.dumps(result))
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
