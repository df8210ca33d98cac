"""``manage.py worker`` through a PostgreSQL outage: it logs one WARNING, waits, and runs
jobs again once PostgreSQL answers, without being restarted.

The outage is real for the worker: it reaches the test database through a loopback proxy
that the test stops and starts (tests/db_proxy.py); the shared server runs on."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from django.conf import settings
from procrastinate.contrib.django.models import ProcrastinateJob

from integrations import tasks
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerChainLink
from integrations.services.ledger import ledger_event_append
from tests.conftest import database_server, database_url, subprocess_env
from tests.db_proxy import DatabaseProxy

pytestmark = pytest.mark.django_db(transaction=True)

PATIENCE_SECONDS = 120  # a bound for a stuck worker, not a timing under test

# ``manage.py worker`` as manage.py runs it, its waits through an outage shortened (as tests
# shorten DROP_LIMITS): its queries give up on the pool after 1 s, not 5 s, before it takes
# PostgreSQL for unreachable, and it asks whether PostgreSQL is back every 0.1 s, not 2 s.
# (Read before set: a renamed constant fails here rather than go unshortened.)
WORKER = """
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
import django
from dropportal import setting_up
with setting_up.collector_paused():  # as manage.py sets up
    django.setup()
from integrations.management.commands import worker
worker.POOL_WAIT_SECONDS = min(worker.POOL_WAIT_SECONDS, 1.0)
worker.RECONNECT_EVERY_SECONDS = min(worker.RECONNECT_EVERY_SECONDS, 0.1)
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", "worker", "--concurrency", "1"])
"""


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_the_worker_waits_through_an_outage_and_resumes() -> None:
    with DatabaseProxy(database_server()) as proxy:
        url = proxy.url_for(database_url())
        worker = subprocess.Popen(  # noqa: S603  (our own script)
            [sys.executable, "-c", WORKER],
            cwd=settings.BASE_DIR,
            env=subprocess_env(DATABASE_URL=url, DROPPORTAL_JOBS_LOG_LEVEL="WARNING"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(worker.stderr or []), daemon=True)
        reader.start()
        try:
            before = ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
            # Queueing locks of the test's own: the worker's minutely seal may be waiting under
            # the task's lock, which refuses a second job.
            tasks.seal_ledger.configure(queueing_lock="outage-test-before").defer()
            _eventually(
                lambda: LedgerChainLink.objects.filter(event_id=before.id).exists(),
                "the worker seals before the outage",
            )

            proxy.stop()
            _eventually(lambda: any("unreachable" in line for line in lines), "a WARNING")
            during = ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
            job_id = tasks.seal_ledger.configure(queueing_lock="outage-test-during").defer()
            proxy.start()

            _eventually(
                lambda: ProcrastinateJob.objects.get(id=job_id).status == "succeeded",
                "the job deferred during the outage runs after it",
            )
            assert LedgerChainLink.objects.filter(event_id=during.id).exists()
            assert worker.poll() is None  # the same process, never restarted
        finally:
            worker.send_signal(signal.SIGINT)
            returncode = worker.wait(timeout=60)
            reader.join(timeout=10)
    assert returncode == 0, "".join(lines)
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) == 1, "".join(lines)
    assert "PostgreSQL is unreachable" in warnings[0]
    output = "".join(lines)
    assert "Traceback" not in output, output[output.find("Traceback") - 800 :]
