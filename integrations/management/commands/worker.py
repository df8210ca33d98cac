"""``manage.py worker``: run the job workers until stopped (Ctrl-C or SIGTERM).

One Procrastinate worker per group of queues, each with its own job slots, so work of one kind
cannot hold the slots of another: deliveries to a slow broker (each call up to its timeout)
never delay DROP pulls and reports, alerts, nor the ledger's sealing. Within the dispatch queue
a broker holds at most ``DROPPORTAL_DISPATCH_SLOTS_PER_BROKER`` slots
(``services.dispatch.deliveries``).

``--queues dispatch`` runs one group only, in this process (to scale a group on its own
hosts). Any number of workers may run, on any number of hosts, against the same PostgreSQL.
When PostgreSQL becomes unreachable the worker logs one WARNING, waits until it answers again
and resumes by itself (a job cut off meanwhile is retried as its task says).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from procrastinate import PsycopgConnector
from procrastinate.contrib.django import app
from procrastinate.contrib.django.settings import settings as procrastinate_settings
from procrastinate.contrib.django.utils import connector_params

from integrations.management.base import one_line_errors, refuse_unreadable_secrets

log = logging.getLogger("integrations.worker")

# How often an idle worker asks whether PostgreSQL is back.
RECONNECT_EVERY_SECONDS = 2.0
# How long the worker's own queries wait for a pooled connection before the outage is taken
# as one (psycopg_pool's default, 30 s, left a worker silent for a minute). A healthy pool
# hands one over in milliseconds: its connections are held only for a query each.
POOL_WAIT_SECONDS = 5.0


def _database_answers() -> bool:
    try:
        connection.close()
        connection.ensure_connection()
        return True
    except DatabaseError:
        return False
    finally:
        connection.close()


def _from_the_database(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or one it was raised from) is a lost or refused connection, not a
    query's own error (a statement timeout is one too, and is not an outage)."""
    import psycopg
    import psycopg_pool

    lost = (psycopg.OperationalError, psycopg.InterfaceError)
    gone = (
        psycopg.errors.AdminShutdown,
        psycopg.errors.CannotConnectNow,
        psycopg.errors.ConnectionFailure,
        psycopg.errors.ConnectionDoesNotExist,
        psycopg_pool.PoolTimeout,
    )
    while exc is not None:
        if type(exc) in lost or isinstance(exc, gone):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _QuietDuringOutage(logging.Filter):
    """The outage is this command's one WARNING: drop psycopg's warnings (the pool's
    per-attempt ones, and those about the broken connections it discards), and the
    tracebacks of the same lost connection that the worker and asyncio log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("psycopg"):
            return False
        if record.name.startswith(("procrastinate", "asyncio")) and record.exc_info:
            return not _from_the_database(record.exc_info[1])
        return True


# Queue groups and their job slots; dispatch's come from --concurrency.
GROUPS: dict[str, tuple[str, ...]] = {
    "dispatch": ("dispatch",),
    "drop": ("drop",),
    "ledger": ("ledger", "maintenance", "alerts"),
}
DROP_CONCURRENCY = 2
LEDGER_CONCURRENCY = 1


class Command(BaseCommand):
    help = (
        "Run the job workers: one per queue group, each with its own job slots (dispatch; "
        "DROP pulls and reports; ledger sealing and maintenance)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        one_line_errors(parser)
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
            queues = tuple(q.strip() for q in options["queues"].split(",") if q.strip())
            known = {q for group in GROUPS.values() for q in group}
            if unknown := sorted(set(queues) - known):
                raise CommandError(
                    f"unknown queue(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
                )
            groups = {"queues": (queues, concurrency)}
        else:
            groups = {
                "dispatch": (GROUPS["dispatch"], concurrency),
                "drop": (GROUPS["drop"], DROP_CONCURRENCY),
                "ledger": (GROUPS["ledger"], LEDGER_CONCURRENCY),
            }
        refuse_unreadable_secrets()
        quiet = _QuietDuringOutage()
        for handler in logging.getLogger().handlers:
            handler.addFilter(quiet)
        app.perform_import_paths()
        while True:
            stopped, failure = asyncio.run(_run_workers(groups))
            if stopped:
                return
            # Without a signal, only a lost connection stops a waiting worker (its side
            # tasks, the heartbeat among them, all talk to PostgreSQL).
            if failure is not None and not _from_the_database(failure):
                raise CommandError(f"the worker stopped: {failure}")
            log.warning(
                "PostgreSQL is unreachable (the worker lost its connection); "
                "the worker waits and resumes when it answers"
            )
            while not _database_answers():
                time.sleep(RECONNECT_EVERY_SECONDS)
            log.info("PostgreSQL answers again; the worker resumes")


async def _run_workers(
    groups: dict[str, tuple[tuple[str, ...], int]],
) -> tuple[bool, BaseException | None]:
    """One Procrastinate worker per group, in this process, each with its own job slots, until
    Ctrl-C or SIGTERM stops them all (each waits for its running jobs, as one worker does) or
    one of them fails. ``(True, None)`` when a signal stopped them, else ``(False, the error)``."""
    loop = asyncio.get_running_loop()
    # Sync jobs run on the loop's default executor: enough threads for every slot at once.
    loop.set_default_executor(ThreadPoolExecutor(sum(n for _, n in groups.values()) + 2, "job"))
    stopping = asyncio.Event()
    # A connector of its own, as `manage.py procrastinate worker` makes (Django's cannot
    # LISTEN), on the same database, with a short wait for a pooled connection.
    connector = PsycopgConnector(
        kwargs=connector_params(procrastinate_settings.DATABASE_ALIAS),
        timeout=POOL_WAIT_SECONDS,
    )
    try:
        with app.replace_connector(connector) as worker_app:
            async with worker_app.open_async():
                workers = [
                    worker_app._worker(  # what App.run_worker_async builds, without handlers
                        queues=list(queues),
                        concurrency=count,
                        name=name,
                        install_signal_handlers=False,
                    )
                    for name, (queues, count) in groups.items()
                ]

                def stop() -> None:
                    stopping.set()
                    for worker in workers:
                        worker.stop()

                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, stop)
                try:
                    # When one stops (stopped, or failed), stop the others too.
                    runs = [asyncio.create_task(worker.run()) for worker in workers]
                    await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
                    for worker in workers:
                        worker.stop()
                    ended = await asyncio.gather(*runs, return_exceptions=True)
                    if failed := [e for e in ended if isinstance(e, Exception)]:
                        raise failed[0]
                finally:
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        loop.remove_signal_handler(signum)
    except Exception as exc:
        return stopping.is_set(), exc
    return stopping.is_set(), None
