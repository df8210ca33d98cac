"""Two evaluations of the alert conditions at once (the periodic job and one an event queued,
on two hosts' workers): each raise and clear is still recorded, and sent, once."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable
from typing import Any

import pytest
from django.db import connection

from integrations.models import LedgerEvent
from integrations.services.staff import alerts
from integrations.services.staff.alerts import Firing, alerts_evaluate
from tests.conftest import sessions_waiting_for_locks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_evaluations_at_once_raise_an_alert_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def always(now: dt.datetime) -> Iterable[Firing]:
        yield Firing(key="it", text="something is wrong")

    monkeypatch.setattr(alerts, "CONDITIONS", {"race_test": always})
    first_recording = threading.Event()
    go_on = threading.Event()
    append = alerts.ledger_event_append

    def held_append(**kwargs: Any) -> Any:
        # The first evaluation stops after raising, before its transaction commits.
        if threading.current_thread().name == "first":
            first_recording.set()
            assert go_on.wait(30)
        return append(**kwargs)

    monkeypatch.setattr(alerts, "ledger_event_append", held_append)

    def evaluate() -> None:
        try:
            alerts_evaluate()
        finally:
            connection.close()

    first = threading.Thread(target=evaluate, name="first")
    second = threading.Thread(target=evaluate, name="second")
    first.start()
    try:
        assert first_recording.wait(30)
        second.start()
        # The second waits on what the first holds (its lock, or the row it raised).
        wait_until(lambda: sessions_waiting_for_locks() >= 1, "the second evaluation to wait")
    finally:
        go_on.set()
        first.join(30)
        if second.ident is not None:
            second.join(30)

    assert LedgerEvent.objects.filter(kind="alert.raised", subject="race_test:it").count() == 1


def test_a_condition_that_fails_holds_back_no_other_condition(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A condition that raises (a stored secret it cannot read, a bug) is one condition not
    evaluated: those after it in the registry still raise and clear their alerts, its own
    alerts stay as they were, and the run still fails, naming it, so the failed job shows."""

    def broken(now: dt.datetime) -> Iterable[Firing]:
        raise RuntimeError("cannot read it")

    def fine(now: dt.datetime) -> Iterable[Firing]:
        yield Firing(key="it", text="something is wrong")

    monkeypatch.setattr(alerts, "CONDITIONS", {"broken": broken, "fine": fine})

    with pytest.raises(Exception) as failed:  # which one: asserted below
        alerts_evaluate()

    assert LedgerEvent.objects.filter(kind="alert.raised", subject="fine:it").count() == 1
    assert str(failed.value) == "alert condition(s) not evaluated: broken"
    assert "alert condition broken could not be evaluated" in caplog.text
