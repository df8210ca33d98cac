"""``manage.py worker``: run the job worker until stopped (Ctrl-C or SIGTERM).

Any number of workers may run, on any number of hosts, against the same PostgreSQL. When
PostgreSQL becomes unreachable the worker logs one WARNING, waits until it answers again
and resumes by itself (a job cut off meanwhile is retried as its task says).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from procrastinate.contrib.django import app

log = logging.getLogger("integrations.worker")

# How often an idle worker asks whether PostgreSQL is back.
RECONNECT_EVERY_SECONDS = 2.0


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
    """The outage is this command's one WARNING: drop the pool's per-attempt warnings, and
    the tracebacks of the same lost connection that the worker and asyncio log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("psycopg.pool"):
            return False
        if record.name.startswith(("procrastinate", "asyncio")) and record.exc_info:
            return not _from_the_database(record.exc_info[1])
        return True


class Command(BaseCommand):
    help = "Run the job worker (dispatches, DROP pulls and reports, ledger sealing, alerts)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=4, help="jobs run at once")

    def handle(self, *args: Any, **options: Any) -> None:
        quiet = _QuietDuringOutage()
        for handler in logging.getLogger().handlers:
            handler.addFilter(quiet)
        while True:
            # A connector of its own (as Procrastinate's own `worker` command): the web's
            # Django connector cannot listen for jobs.
            with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
                stopped, failure = asyncio.run(self._run(options["concurrency"]))
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

    async def _run(self, concurrency: int) -> tuple[bool, BaseException | None]:
        """Run the worker once; ``(True, None)`` when a signal stopped it, else ``(False,
        the error)`` (the worker also stops by itself when its connection is lost)."""
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            async with app.open_async():
                run = asyncio.create_task(
                    app.run_worker_async(concurrency=concurrency, install_signal_handlers=False)
                )

                def stop() -> None:
                    stopping.set()
                    run.cancel()  # the worker finishes its running jobs, then stops

                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, stop)
                try:
                    await run
                finally:
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        loop.remove_signal_handler(signum)
        except asyncio.CancelledError:
            if stopping.is_set():
                return True, None
            raise
        except Exception as exc:
            return stopping.is_set(), exc
        return stopping.is_set(), None
