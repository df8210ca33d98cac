"""The periodic DROP jobs' first step: queue one job per broker that is due, once.

The pull and the report share one shape: a selector says which brokers are due, and the
enqueue module defers each broker's job under a lock named after it, so a broker never has
two waiting (``enqueue.drop_pull_enqueue``, ``enqueue.drop_report_enqueue``)::

    drop_pulls_enqueue_due(now=timezone.now())   # how many pull jobs were queued
    drop_reports_enqueue_due()                   # how many report jobs were queued
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from integrations import enqueue
from integrations.models import Broker
from integrations.selectors.pulls import (
    brokers_due_for_pull,
    brokers_due_for_report,
    latest_cycle_pk,
)


def drop_pulls_enqueue_due(*, now: dt.datetime) -> int:
    """A pull job per broker due for one (``selectors.pulls.brokers_due_for_pull``)."""
    return _each_broker_enqueue(brokers_due_for_pull(now=now), drop_pull_ask)


def drop_pull_ask(*, broker_pk: int, broker_id: str) -> bool:
    """A pull job for the broker (False when one already waits), asked with its latest cycle:
    a pull running now (a ``download.ready`` arriving while the periodic pull waits through
    DROP's 202, or the reverse) may be importing the very package this one is for, and
    asking DROP again after it would only get a 409 (statuses owed) and a false alert."""
    return enqueue.drop_pull_enqueue(
        broker_pk=broker_pk, broker_id=broker_id, latest_cycle=latest_cycle_pk(broker_pk)
    )


def drop_reports_enqueue_due() -> int:
    """A report job per broker that reports automatically (``brokers_due_for_report``)."""
    return _each_broker_enqueue(brokers_due_for_report(), enqueue.drop_report_enqueue)


def _each_broker_enqueue(brokers: Iterable[Broker], broker_enqueue: Callable[..., bool]) -> int:
    # False from the enqueue: that broker's previous job has not started yet.
    return sum(broker_enqueue(broker_pk=b.pk, broker_id=b.broker_id) for b in brokers)
