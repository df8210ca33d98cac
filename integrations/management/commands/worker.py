"""``manage.py worker``: run the job workers until stopped (Ctrl-C or SIGTERM).

One worker process per group of queues, each with its own job slots, so work of one kind
cannot hold the slots of another: deliveries to a slow broker (each call up to its timeout)
never delay DROP pulls and reports, nor the ledger's sealing. Within the dispatch queue a
broker holds at most ``DROPPORTAL_DISPATCH_SLOTS_PER_BROKER`` slots (``dispatch.deliveries``).

``--queues dispatch`` runs one group only, in this process (to scale a group on its own
hosts). Any number of workers may run, on any number of hosts, against the same PostgreSQL.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

# Queue groups and their job slots; dispatch's come from --concurrency.
GROUPS: dict[str, tuple[str, ...]] = {
    "dispatch": ("dispatch",),
    "drop": ("drop",),
    "ledger": ("ledger", "maintenance"),
}
DROP_CONCURRENCY = 2
LEDGER_CONCURRENCY = 1


class Command(BaseCommand):
    help = (
        "Run the job workers: one process per queue group (dispatch; DROP pulls and "
        "reports; ledger sealing and maintenance)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency", type=int, default=4, help="delivery jobs run at once (dispatch)"
        )
        parser.add_argument(
            "--queues",
            default="",
            help="run only these queues (comma-separated) in this process",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency = options["concurrency"]
        if concurrency < 1:
            raise CommandError("--concurrency must be 1 or more")
        if options["queues"]:
            queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
            known = {q for group in GROUPS.values() for q in group}
            if unknown := sorted(set(queues) - known):
                raise CommandError(
                    f"unknown queue(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
                )
            call_command(
                "procrastinate",
                "worker",
                "--queues",
                ",".join(queues),
                "--concurrency",
                str(concurrency),
            )
            return
        self._run_groups(concurrency)

    def _run_groups(self, concurrency: int) -> None:
        slots = {"dispatch": concurrency, "drop": DROP_CONCURRENCY, "ledger": LEDGER_CONCURRENCY}
        children = [
            subprocess.Popen(  # noqa: S603
                [
                    sys.executable,
                    "manage.py",
                    "worker",
                    "--queues",
                    ",".join(queues),
                    "--concurrency",
                    str(slots[name]),
                ],
                cwd=settings.BASE_DIR,
            )
            for name, queues in GROUPS.items()
        ]

        def forward(signum: int, frame: FrameType | None) -> None:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        # When one group stops (stopped, or failed), stop the others too.
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        forward(signal.SIGTERM, None)
        codes = [child.wait() for child in children]
        failed = next((code for code in codes if code not in (0, -signal.SIGTERM)), 0)
        if failed:
            raise CommandError(f"a worker group stopped with exit code {failed}")
