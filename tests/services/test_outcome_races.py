"""Two outcomes for two requests of one work item, recorded at the same moment: the second
to take the work item's lock must see the first's outcome, so the item settles.

This test commits (threads and a second connection must see the rows).
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connections

from integrations.models import Broker, DeletionRequest, RequestState, WorkItemState
from integrations.services.dispatch.outcomes import deletion_outcome_record
from tests.builders import (
    DeletionRequestFactory,
    WorkItemFactory,
    webhook_integration_created,
)
from tests.conftest import database_url, sessions_waiting_for_locks

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_outcomes_of_one_work_item_at_once_settle_it(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle__broker=broker)
    crm = webhook_integration_created(broker, "https://crm.example/hooks").integration
    erp = webhook_integration_created(broker, "https://erp.example/hooks", name="ERP").integration
    requests = [
        DeletionRequestFactory.create(
            integration=integration, work_item=item, state=RequestState.DISPATCHED
        )
        for integration in (crm, erp)
    ]
    outcomes = dict(zip((r.pk for r in requests), ("deleted", "opted_out"), strict=True))
    errors: list[BaseException] = []

    def record(request: DeletionRequest) -> None:
        try:
            deletion_outcome_record(
                deletion_request=request,
                drop_outcome=outcomes[request.pk],
                opt_out_email="Ann@Example.com",
                actor="apikey:dpk_test",
            )
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    # Another transaction holds the work item, so both callbacks record their outcome and
    # then wait for the item's lock together.
    holder = psycopg.connect(database_url())
    try:
        holder.execute("SELECT 1 FROM integrations_workitem WHERE id = %s FOR UPDATE", [item.pk])
        threads = [threading.Thread(target=record, args=(r,)) for r in requests]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() < 2:
            assert time.monotonic() < deadline, "the callbacks did not both wait for the lock"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors, errors
    item.refresh_from_db()
    assert (item.state, item.status_code) == (WorkItemState.REPORTABLE, 4)  # opted_out wins
