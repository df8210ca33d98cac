"""Benchmark: anchor the ledger's chain head with an RFC 3161 authority, on a large ledger.

A ledger of ``--events`` events (1,000,000 by default: a cycle's import, matches and
settlements), hashed by the database's own function and chained by ``ledger_seal``. Then
``ledger_anchor`` (what ``ledger anchor`` and the daily job run) is timed ``--repeats``
times against a loopback authority (``devtools/tsa_simulator.py``: OpenSSL's ``ts -reply``),
each after one more event so it seals a little first, as the daily job does; and
``ledger_anchors_verify`` with the authority's certificate (the part ``ledger verify`` adds).

Target: one anchoring in 2 seconds or less, the median of the repeats (it is a seal of what
is new, one request and one insert: the ledger's size should not show; the first also pays
for the first connection and OpenSSL's start, so the worst is reported apart). Checked:
every token verifies against the authority's certificate and covers the head it was asked
for.

Everything happens in a scratch database created next to ``DATABASE_URL``'s (it needs the
CREATEDB right) and dropped at the end.

    DATABASE_URL=postgres://... python bench/bench_anchor.py [--events 1000000] [--repeats 5]

Prints one line of JSON last; exits 1 when the target is missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import statistics
import time

from scratch_db import admin_execute, scratch_names, with_database

SECONDS_TARGET = 2.0

_EVENTS_SQL = """
INSERT INTO integrations_ledgerevent (created_at, broker_id, kind, subject, actor, data, event_hash)
SELECT at, '4821', 'work_item.status_settled', n::text, 'system', data::jsonb,
       dropportal_ledger_event_hash(at, '4821', 'work_item.status_settled', n::text, 'system',
                                    data)
FROM (SELECT n, now() - interval '1 day' + n * interval '1 millisecond' AS at,
             '{"cycle":"1","status_code":1}' AS data
      FROM generate_series(1, %s) AS n) AS e
"""


def populate(events: int) -> float:
    """The events, then ``ledger_seal`` over all of them; the seal's seconds."""
    from django.db import connection

    from integrations.services.ledger import ledger_seal

    with connection.cursor() as cursor:
        cursor.execute(_EVENTS_SQL, [events])
        cursor.execute("ANALYZE")
    started = time.perf_counter()
    ledger_seal()
    return time.perf_counter() - started


def run(repeats: int) -> dict[str, float | int | bool]:
    from django.conf import settings
    from django.db import transaction

    from devtools.tsa_simulator import TsaSimulator
    from integrations.evidence.timestamps import load_certificates
    from integrations.ledger_kinds import LedgerKind
    from integrations.models import LedgerChainLink
    from integrations.services.ledger import ledger_event_append
    from integrations.services.ledger_anchors import ledger_anchor, ledger_anchors_verify

    seconds: list[float] = []
    covered = True
    with TsaSimulator() as tsa:
        settings.DROPPORTAL_TSA_URL = tsa.url
        settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True  # the authority is on loopback
        for _ in range(repeats):
            with transaction.atomic():
                ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id="4821")
            started = time.perf_counter()
            anchor = ledger_anchor(actor="bench")
            seconds.append(time.perf_counter() - started)
            head = LedgerChainLink.objects.get(position=anchor.position)
            covered = covered and head.chain_hash == anchor.chain_hash
        started = time.perf_counter()
        checked, problems = ledger_anchors_verify(authorities=load_certificates(tsa.ca_pem))
        verify_seconds = time.perf_counter() - started
    return {
        "anchor_seconds": statistics.median(seconds),
        "anchor_seconds_best": min(seconds),
        "anchor_seconds_worst": max(seconds),
        "verify_tokens_seconds": verify_seconds,
        "tokens": checked,
        "correct": covered and checked == repeats and not problems,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url:
        print("set DATABASE_URL (the bench creates a scratch database next to it)")
        return 2
    admin_url, name = scratch_names(base_url, "bench_anchor")
    os.environ["DATABASE_URL"] = with_database(base_url, name)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        seal_seconds = populate(args.events)
        result = run(args.repeats)
    finally:
        from django.db import connections

        connections.close_all()
        admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    met = bool(result["correct"]) and float(result["anchor_seconds"]) <= SECONDS_TARGET
    print(
        json.dumps(
            {
                "name": "bench_anchor",
                "events": args.events,
                "seal_seconds": round(seal_seconds, 2),
                **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()},
                "target_seconds": SECONDS_TARGET,
                "target_met": met,
            }
        )
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
