"""The continuing duty against what runs beside it, on two real connections: a recurring
round (or a canary round) inserting requests while staff forget a consumer or retire a
target. Each side must end, and what it leaves must hold: a forgotten consumer is pointed at
by no request, a retired target gets no request.

These tests commit (threads and a second connection must see the rows).
"""

from __future__ import annotations

import base64
import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest

from devtools.drop_simulator import work_items
from integrations.consumers.sources import consumer_sources
from integrations.models import (
    Broker,
    Consumer,
    DeletionRequest,
    DropCycle,
    Integration,
    RequestState,
    WorkItem,
)
from integrations.services.cycle import canaries, drop_import, recurring
from integrations.services.cycle.canaries import canary_add, canary_round_send
from integrations.services.cycle.consumers import (
    consumer_forget,
    consumers_import,
    consumers_replace,
)
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.cycle.recurring import recurring_rounds_send
from integrations.services.staff.integrations import (
    integration_retire,
    webhook_integration_create,
)
from tests.builders import (
    ConsumerFactory,
    DeletionRequestFactory,
    WorkItemFactory,
    drop_noon,
    drop_zip,
    write_zip,
)
from tests.conftest import in_thread, sessions_waiting_for_locks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

DAY = dt.timedelta(days=1)


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _target(broker: Broker, name: str = "CRM") -> Integration:
    # Port 9 (discard): nothing here delivers.
    return webhook_integration_create(
        broker=broker, name=name, url=f"http://127.0.0.1:9/{name}", actor="test"
    ).integration


def _deleted(broker: Broker, target: Integration, at: dt.datetime) -> tuple[WorkItem, Consumer]:
    item = WorkItemFactory.create(cycle__broker=broker, status_code=3)
    consumer: Consumer = ConsumerFactory.create(broker=broker, hashes={"email": "AAAA"})
    DeletionRequestFactory.create(
        integration=target,
        work_item=item,
        consumer=consumer,
        remote_identifier=consumer.remote_identifier,
        drop_outcome="deleted",
        completed_at=at,
    )
    return item, consumer


def _held_after(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str
) -> tuple[threading.Event, threading.Event]:
    """``module.name`` runs, then waits for ``release`` (``reached`` once it ran): its
    transaction has written its requests and not committed."""
    reached, release = threading.Event(), threading.Event()
    real = getattr(module, name)

    def held(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        reached.set()
        release.wait(30)
        return result

    monkeypatch.setattr(module, name, held)
    return reached, release


def _side_ends_or_waits(thread: threading.Thread) -> None:
    wait_until(
        lambda: not thread.is_alive() or sessions_waiting_for_locks() >= 1,
        "the other side neither ended nor waited for a lock",
    )


def test_two_runs_at_once_send_each_round_once(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's run and a command's, on two connections: the second reads the schedule
    while the first's batch holds the lock, and sends nothing the first sent."""
    target = _target(broker)
    now = drop_noon()
    items = [_deleted(broker, target, now - 45 * DAY)[0] for _ in range(3)]
    reached, release = _held_after(monkeypatch, recurring, "directives_issue")
    errors: list[BaseException] = []
    totals: list[int] = []

    def run() -> None:
        totals.append(recurring_rounds_send(broker=broker, actor="t", now=now).work_items)

    first = in_thread(run, errors)
    assert reached.wait(30), "the first run's batch did not insert its requests"
    reached.clear()
    second = in_thread(run, errors)
    wait_until(lambda: sessions_waiting_for_locks("advisory") >= 1, "the second did not wait")
    release.set()
    first.join(60)
    second.join(60)

    assert not first.is_alive() and not second.is_alive()
    assert errors == []
    assert sorted(totals) == [0, 3]
    for item in items:
        assert DeletionRequest.objects.filter(work_item=item, round=1).count() == 1
    assert not DeletionRequest.objects.filter(round__gt=1).exists()


def test_a_consumer_forgotten_while_its_round_is_being_sent_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's batch has inserted the consumer's requests and not committed when staff
    forget the consumer: neither may fail on the other's rows (a foreign key checked at
    commit), and no request is left pointing at a consumer that is gone."""
    target = _target(broker)
    now = drop_noon()
    item, consumer = _deleted(broker, target, now - 45 * DAY)
    reached, release = _held_after(monkeypatch, recurring, "directives_issue")
    errors: list[BaseException] = []

    sending = in_thread(lambda: recurring_rounds_send(broker=broker, actor="t", now=now), errors)
    assert reached.wait(30), "the round's batch did not insert its requests"
    forgetting = in_thread(
        lambda: consumer_forget(
            broker=broker, remote_identifier=consumer.remote_identifier, actor="test"
        ),
        errors,
    )
    _side_ends_or_waits(forgetting)
    release.set()
    sending.join(60)
    forgetting.join(60)

    assert not sending.is_alive() and not forgetting.is_alive()
    assert errors == []
    assert not Consumer.objects.filter(pk=consumer.pk).exists()
    round_one = DeletionRequest.objects.filter(work_item=item, round=1)
    assert round_one.count() == 1
    assert round_one.get().consumer_id is None  # it keeps its copy of the pointer


def test_a_consumer_a_replace_forgets_while_its_round_is_being_sent_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same with a replace (``consumers --replace``) whose files no longer list the
    consumer."""
    target = _target(broker)
    now = drop_noon()
    listed = tmp_path / "before.csv"
    listed.write_text("remote_identifier,email\nC-1,anna@example.com\nC-2,bob@example.com\n")
    consumers_import(
        broker=broker,
        files=consumer_sources(str(listed)).files,
        hashed=False,
        actor="test",
        source="file:before",
    )
    consumer = Consumer.objects.get(remote_identifier="C-2")
    item = WorkItemFactory.create(cycle__broker=broker, status_code=3)
    DeletionRequestFactory.create(
        integration=target,
        work_item=item,
        consumer=consumer,
        remote_identifier=consumer.remote_identifier,
        drop_outcome="deleted",
        completed_at=now - 45 * DAY,
    )
    again = tmp_path / "again.csv"
    again.write_text("remote_identifier,email\nC-1,anna@example.com\n")
    reached, release = _held_after(monkeypatch, recurring, "directives_issue")
    errors: list[BaseException] = []

    sending = in_thread(lambda: recurring_rounds_send(broker=broker, actor="t", now=now), errors)
    assert reached.wait(30), "the round's batch did not insert its requests"
    replacing = in_thread(
        lambda: consumers_replace(
            broker=broker,
            files=consumer_sources(str(again)).files,
            hashed=False,
            actor="test",
            source="file:again",
            force=True,
        ),
        errors,
    )
    _side_ends_or_waits(replacing)
    release.set()
    sending.join(60)
    replacing.join(60)

    assert not sending.is_alive() and not replacing.is_alive()
    assert errors == []
    assert not Consumer.objects.filter(pk=consumer.pk).exists()
    assert DeletionRequest.objects.get(work_item=item, round=1).consumer_id is None


def test_a_consumer_forgotten_while_a_drop_import_matches_it_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same with the match of a DROP download, held once it joined the consumer hashes:
    forgetting the consumer meanwhile must neither roll the whole import back at its commit
    nor leave the item it matched with no request (open, owing DROP a status no answer
    will ever settle)."""
    _target(broker)
    items = list(work_items(2))
    consumer = ConsumerFactory.create(
        broker=broker, remote_identifier="C-1", hashes={"email": items[0][1]}
    )
    package = write_zip(tmp_path, drop_zip(broker, {"Email": items}), name="20261120_4821_DROP.zip")
    reached, release = _held_after(monkeypatch, drop_import, "staged_items_match")
    errors: list[BaseException] = []

    importing = in_thread(
        lambda: drop_zip_import(broker=broker, path=package, actor="test"), errors
    )
    assert reached.wait(30), "the import did not reach its matching"
    forgetting = in_thread(
        lambda: consumer_forget(broker=broker, remote_identifier="C-1", actor="test"), errors
    )
    _side_ends_or_waits(forgetting)
    release.set()
    importing.join(60)
    forgetting.join(60)

    assert not importing.is_alive() and not forgetting.is_alive()
    assert errors == []
    assert DropCycle.objects.filter(broker=broker).count() == 1
    assert not Consumer.objects.filter(pk=consumer.pk).exists()
    assert list(DeletionRequest.objects.values_list("consumer_id", flat=True)) == [None]
    assert WorkItem.objects.get(hash=base64.b64decode(items[0][1])).deletion_requests.count() == 1


def test_a_target_retired_while_a_canary_round_is_sent_gets_no_request_left_waiting(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``drop canary`` has inserted its requests and not committed when staff retire a
    target: the retirement must either come first (no request for it) or cancel the
    round's request, never leave one queued for a target that will never be enabled."""
    kept = _target(broker, "CRM")
    retired = _target(broker, "Warehouse")
    ConsumerFactory.create(broker=broker, remote_identifier="TEST-0001", hashes={"email": "AAAA"})
    canary_add(broker=broker, remote_identifier="TEST-0001", actor="test")
    reached, release = _held_after(monkeypatch, canaries, "canary_requests_create")
    errors: list[BaseException] = []

    sending = in_thread(lambda: canary_round_send(broker=broker, actor="test"), errors)
    assert reached.wait(30), "the canary round did not insert its requests"
    retiring = in_thread(
        lambda: integration_retire(integration=retired, reason="replaced", actor="test"),
        errors,
    )
    _side_ends_or_waits(retiring)
    release.set()
    sending.join(60)
    retiring.join(60)

    assert not sending.is_alive() and not retiring.is_alive()
    assert errors == []
    assert Integration.objects.get(pk=retired.pk).retired_at is not None
    assert not DeletionRequest.objects.filter(
        integration=retired, canary_round__isnull=False, state=RequestState.QUEUED
    ).exists()
    assert DeletionRequest.objects.filter(integration=kept, state=RequestState.QUEUED).count() == 1
