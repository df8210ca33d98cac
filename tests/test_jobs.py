"""Jobs are enqueued in the caller's transaction: a rolled-back change never runs its job."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from procrastinate.contrib.django import app
from procrastinate.contrib.django.models import ProcrastinateJob

from integrations import tasks
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerChainLink, LedgerEvent
from integrations.services.ledger import ledger_event_append

pytestmark = pytest.mark.django_db(transaction=True)

SEAL_TASK = "integrations.tasks.seal_ledger"


@pytest.fixture(autouse=True)
def empty_job_tables() -> Iterator[None]:
    # Procrastinate's tables are not Django-managed, so the test flush leaves them alone.
    def truncate() -> None:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE procrastinate_jobs, procrastinate_periodic_defers CASCADE")

    truncate()
    yield
    truncate()


def run_worker() -> None:
    """Run a real worker (its own connection, as ``manage.py worker``) until the queue is empty."""
    with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
        app.run_worker(wait=False, install_signal_handlers=False, listen_notify=False)


def test_job_enqueued_in_a_rolled_back_transaction_never_runs() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
        tasks.seal_ledger.defer()
        raise RuntimeError("the change fails")
    assert not ProcrastinateJob.objects.filter(task_name=SEAL_TASK).exists()
    assert not LedgerEvent.objects.exists()


def test_job_enqueued_in_a_committed_transaction_runs() -> None:
    with transaction.atomic():
        event = ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
        job_id = tasks.seal_ledger.defer()
    job = ProcrastinateJob.objects.get(id=job_id)
    assert job.status == "todo"
    assert not LedgerChainLink.objects.exists()
    run_worker()
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert LedgerChainLink.objects.filter(event_id=event.id).exists()
