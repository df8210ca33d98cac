"""``manage.py worker``: run the job workers until stopped (Ctrl-C or SIGTERM).

One Procrastinate worker per group of queues, each with its own job slots, so work of one kind
cannot hold the slots of another: deliveries to a slow broker (each call up to its timeout)
never delay DROP pulls and reports, nor the ledger's sealing. Within the dispatch queue a
broker holds at most ``DROPPORTAL_DISPATCH_SLOTS_PER_BROKER`` slots (``dispatch.deliveries``).

``--queues dispatch`` runs one group only, in this process (to scale a group on its own
hosts). Any number of workers may run, on any number of hosts, against the same PostgreSQL.
"""

from __future__ import annotations

import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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
        "Run the job workers: one per queue group, each with its own job slots (dispatch; "
        "DROP pulls and reports; ledger sealing and maintenance)."
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
        asyncio.run(_run_workers(slots))


async def _run_workers(slots: dict[str, int]) -> None:
    """One Procrastinate worker per group, in this process, each with its own job slots;
    Ctrl-C or SIGTERM stops them all (each waits for its running jobs, as one worker does)."""
    from procrastinate.contrib.django import app

    app.perform_import_paths()
    loop = asyncio.get_running_loop()
    # Sync jobs run on the loop's default executor: enough threads for every slot at once.
    loop.set_default_executor(ThreadPoolExecutor(sum(slots.values()) + 2, "job"))
    # As `manage.py procrastinate worker` does: Django's connector cannot LISTEN.
    connector = app.connector.get_worker_connector()  # type: ignore[attr-defined]
    with app.replace_connector(connector) as worker_app:
        await _run_with(worker_app, slots, loop)


async def _run_with(
    worker_app: Any, slots: dict[str, int], loop: asyncio.AbstractEventLoop
) -> None:
    async with worker_app.open_async():
        workers = [
            worker_app._worker(  # what App.run_worker_async builds, without signal handlers
                queues=list(GROUPS[name]),
                concurrency=count,
                name=name,
                install_signal_handlers=False,
            )
            for name, count in slots.items()
        ]

        def stop() -> None:
            for worker in workers:
                worker.stop()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop)
        try:
            # When one stops (stopped, or a side task failed), stop the others too.
            runs = [asyncio.create_task(worker.run()) for worker in workers]
            await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
            stop()
            await asyncio.gather(*runs)
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
