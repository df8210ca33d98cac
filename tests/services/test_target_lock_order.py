"""Retiring or enabling an integration (or a SaaS connection) while one of its deliveries
is in flight and is answered 410 Gone: the delivery batch holds its rows and then disables
their target, so a staff action that held the target and then waited for those rows would
deadlock with it. Both must end, neither refused by a deadlock.

The same for those staff actions (and an ISI integration's connection refresh) while a DROP
import holds the broker's matching lock: the import inserts requests naming the target
(their foreign key check locks its row) and cancels the requests of removed work items, so an
action that held the target or those requests and then waited for the matching lock would
deadlock with it.

And the rows several transactions lock in one: a delivery batch that settles the work items
of what it delivered (a SaaS deletion's, an ISI answer's) and a retirement that settles those
of what it cancelled take them in id order; an import that removes items takes their
requests (which a batch in flight holds) before them, and their earlier cycles (which a
report holds while it marks their items) before them too. A statement that updates many
work items (a late match, a file's rows released or given up, the items DROP removed
closed) locks them by id first: the test makes its plan read them in another order (DROP's
work item ids, or rows rewritten since) than the one a batch settles. The report's two
markings of a cycle's rows are the measured exception (``matching_lock``); DROP taking a file
locks its cycle first, as an import closing removed items does.

This test commits (threads and a second connection must see the rows).
"""

from __future__ import annotations

import json
import threading
from base64 import b64encode
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from devtools.broker_simulator import BrokerSimulator, Reply
from devtools.drop_simulator import DropSimulator, work_items
from devtools.isi_simulator import IsiSimulator
from integrations.consumers.api_reader import parse_api_consumers
from integrations.drop.client import DropClient
from integrations.models import (
    Broker,
    DeletionRequest,
    DropCycle,
    Integration,
    ReportFile,
    ReportFileState,
    ReportKind,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle import drop_import
from integrations.services.cycle.consumers import consumers_register
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.cycle.isi_connections import isi_connections_refresh
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.dispatch import deliveries
from integrations.services.dispatch.deliveries import (
    deletion_requests_deliver,
    resolution_requests_deliver,
    saas_deletions_deliver,
)
from integrations.services.reporting.report_approval import report_file_reject
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import report_file_discard
from integrations.services.reporting.report_uploads import report_files_upload
from integrations.services.staff.brokers import broker_update
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    integration_retire,
)
from integrations.services.staff.saas import (
    saas_connection_disable,
    saas_connection_enable,
    saas_connection_retire,
)
from tests.builders import (
    CONNECTION_A,
    ConsumerFactory,
    DeletionRequestFactory,
    ResolutionRequestFactory,
    SaasConnectionFactory,
    SaasDeletionFactory,
    WorkItemFactory,
    broker_connections,
    broker_reports_to,
    drop_zip,
    isi_integration_created,
    webhook_integration_created,
    write_zip,
)
from tests.conftest import in_thread, sessions_waiting_for_locks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


@contextmanager
def _answers_held(
    simulator: BrokerSimulator,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Each answer of ``simulator`` held until ``release``; ``arrived`` once a call came in."""
    arrived, release = threading.Event(), threading.Event()
    record = simulator._record

    def held(*args: Any, **kwargs: Any) -> Reply:
        reply = record(*args, **kwargs)
        arrived.set()
        release.wait(30)
        return reply

    simulator._record = held  # type: ignore[method-assign]
    try:
        yield arrived, release
    finally:
        release.set()


@pytest.fixture
def held_410() -> Iterator[tuple[BrokerSimulator, threading.Event, threading.Event]]:
    """A broker whose receiver answers 410 Gone, each answer held until ``release``."""
    with (
        BrokerSimulator(default_reply=Reply.gone()) as simulator,
        _answers_held(simulator) as (arrived, release),
    ):
        yield simulator, arrived, release


def _race(
    deliver: Callable[[], object],
    arrived: threading.Event,
    release: threading.Event,
    staff_action: Callable[[], object],
) -> list[BaseException]:
    """``deliver``; while its 410 is held, run ``staff_action`` until it waits for the row
    the batch holds; then let the 410 come back. The errors of either."""
    errors: list[BaseException] = []
    delivering = in_thread(deliver, errors)
    assert arrived.wait(30), "the delivery did not reach the broker"
    acting = in_thread(staff_action, errors)
    wait_until(
        lambda: sessions_waiting_for_locks() >= 1, "the staff action did not wait for the request"
    )
    release.set()  # the 410 comes back: the batch disables the integration
    delivering.join(60)
    acting.join(60)
    assert not delivering.is_alive() and not acting.is_alive()
    return errors


def test_a_410_answered_while_its_integration_is_retired_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    simulator, arrived, release = held_410
    integration = webhook_integration_created(broker, simulator.url).integration
    request = DeletionRequestFactory.create(integration=integration, state=RequestState.QUEUED)

    errors = _race(
        lambda: deletion_requests_deliver(request_ids=[request.pk]),
        arrived,
        release,
        lambda: integration_retire(integration=integration, reason="replaced", actor="test"),
    )

    assert errors == []
    integration = Integration.objects.get(pk=integration.pk)
    assert integration.retired_at is not None and not integration.enabled
    request = DeletionRequest.objects.get(pk=request.pk)
    assert request.state == RequestState.CANCELLED
    assert request.delivery_attempts.get().status == 410


def test_a_410_answered_while_its_integration_is_enabled_again_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    """Staff paused the integration while the batch was sending, and enable it again."""
    simulator, arrived, release = held_410
    integration = webhook_integration_created(broker, simulator.url).integration
    request = DeletionRequestFactory.create(integration=integration, state=RequestState.QUEUED)

    def pause_and_enable() -> None:
        integration_disable(integration=integration, reason="paused", actor="test")
        integration_enable(integration=integration, actor="test")

    errors = _race(
        lambda: deletion_requests_deliver(request_ids=[request.pk]),
        arrived,
        release,
        pause_and_enable,
    )

    assert errors == []
    # The 410 came after the pause: the integration stays as staff left it, enabled, and
    # the request is queued again at once.
    assert Integration.objects.get(pk=integration.pk).enabled
    request = DeletionRequest.objects.get(pk=request.pk)
    assert request.state == RequestState.QUEUED
    assert request.delivery_attempts.get().status == 410


def _saas_deletion(broker: Broker, url: str) -> SaasDeletion:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    resolution = ResolutionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        identifiers=json.dumps({"email": [{"email": "ann@example.com"}]}),
    )
    mailer = SaasConnectionFactory.create(broker=broker, url=url, token="tok-mailer")
    return SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer)


def test_a_410_answered_while_its_saas_connection_is_retired_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    simulator, arrived, release = held_410
    deletion = _saas_deletion(broker, simulator.url)

    errors = _race(
        lambda: saas_deletions_deliver(deletion_ids=[deletion.pk]),
        arrived,
        release,
        lambda: saas_connection_retire(
            connection=deletion.saas_connection, reason="replaced", actor="test"
        ),
    )

    assert errors == []
    mailer = SaasConnection.objects.get(pk=deletion.saas_connection_id)
    assert mailer.retired_at is not None and not mailer.enabled
    deletion = SaasDeletion.objects.get(pk=deletion.pk)
    assert deletion.state == RequestState.CANCELLED
    assert deletion.delivery_attempts.get().status == 410


def test_a_410_answered_while_its_saas_connection_is_enabled_again_ends_both(
    broker: Broker, held_410: tuple[BrokerSimulator, threading.Event, threading.Event]
) -> None:
    simulator, arrived, release = held_410
    deletion = _saas_deletion(broker, simulator.url)

    def pause_and_enable() -> None:
        saas_connection_disable(connection=deletion.saas_connection, reason="paused", actor="t")
        saas_connection_enable(connection=deletion.saas_connection, actor="test")

    errors = _race(
        lambda: saas_deletions_deliver(deletion_ids=[deletion.pk]),
        arrived,
        release,
        pause_and_enable,
    )

    assert errors == []
    assert SaasConnection.objects.get(pk=deletion.saas_connection_id).enabled
    deletion = SaasDeletion.objects.get(pk=deletion.pk)
    assert deletion.state == RequestState.QUEUED
    assert deletion.delivery_attempts.get().status == 410


# -- while a DROP import holds the matching lock ----------------------------------------------

ITEMS = list(work_items(2))


def _package(broker: Broker, directory: Path, name: str, **lists: Any) -> Path:
    removed = lists.pop("removed", None)
    return write_zip(directory, drop_zip(broker, lists, removed), name=name)


def _during_import(
    monkeypatch: pytest.MonkeyPatch,
    broker: Broker,
    package: Path,
    staff_action: Callable[[], object],
) -> list[BaseException]:
    """Import ``package``; once it holds the broker's matching lock (joined, its requests not
    written yet), run ``staff_action`` until it waits for that lock; then let the import go
    on. The errors of either."""
    joined, release = threading.Event(), threading.Event()
    join = drop_import.staged_items_match

    def join_then_hold(**kwargs: Any) -> int:
        matched = join(**kwargs)
        joined.set()
        release.wait(30)
        return matched

    monkeypatch.setattr(drop_import, "staged_items_match", join_then_hold)
    errors: list[BaseException] = []
    try:
        importing = in_thread(
            lambda: drop_zip_import(broker=broker, path=package, actor="test"), errors
        )
        assert joined.wait(30), "the import did not reach its matching"
        acting = in_thread(staff_action, errors)
        wait_until(
            lambda: sessions_waiting_for_locks("advisory") >= 1,
            "the staff action did not wait for the matching lock",
        )
    finally:
        release.set()
    importing.join(60)
    acting.join(60)
    assert not importing.is_alive() and not acting.is_alive()
    return errors


def test_an_integration_retired_while_an_import_matches_for_it_ends_both(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import's new request names the integration: its foreign key check must not wait
    for a retirement that waits for the import."""
    integration = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    package = _package(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS)

    errors = _during_import(
        monkeypatch,
        broker,
        package,
        lambda: integration_retire(integration=integration, reason="replaced", actor="test"),
    )

    assert errors == []
    assert Integration.objects.get(pk=integration.pk).retired_at is not None
    # The import's request was cancelled by the retirement, and the match waits for a target.
    states = set(DeletionRequest.objects.values_list("state", "integration"))
    assert states == {(RequestState.CANCELLED, integration.pk), (RequestState.PENDING, None)}


def test_an_integration_retired_while_an_import_removes_one_of_its_items_ends_both(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import cancels the queued request of an item DROP removed: the retirement must not
    hold that request while it waits for the import."""
    integration = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    drop_zip_import(
        broker=broker,
        path=_package(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS),
        actor="test",
    )
    request = DeletionRequest.objects.get()
    assert request.state == RequestState.QUEUED
    removed = [(WorkItem.objects.get(deletion_requests=request).work_item_id, ITEMS[0][1], "Email")]
    package = _package(broker, tmp_path, "20261121_4821_DROP.zip", Email=[], removed=removed)

    errors = _during_import(
        monkeypatch,
        broker,
        package,
        lambda: integration_retire(integration=integration, reason="replaced", actor="test"),
    )

    assert errors == []
    assert Integration.objects.get(pk=integration.pk).retired_at is not None
    request = DeletionRequest.objects.get()
    assert request.state == RequestState.CANCELLED
    assert "removed by DROP" in request.last_error


def test_an_integration_enabled_while_an_import_matches_for_it_ends_both(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    integration = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
    integration_disable(integration=integration, reason="paused", actor="test")
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    package = _package(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS)

    errors = _during_import(
        monkeypatch,
        broker,
        package,
        lambda: integration_enable(integration=integration, actor="test"),
    )

    assert errors == []
    assert Integration.objects.get(pk=integration.pk).enabled
    assert DeletionRequest.objects.get().state == RequestState.QUEUED


def test_isi_connections_refreshed_while_an_import_matches_for_them_end_both(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with IsiSimulator(connections=broker_connections(), token="static-t0ken") as api:
        integration = isi_integration_created(broker, api, oauth=False).integration
        ConsumerFactory.create(
            broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]}
        )
        package = _package(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS)

        errors = _during_import(
            monkeypatch,
            broker,
            package,
            lambda: isi_connections_refresh(integration=integration, actor="test"),
        )

    assert errors == []
    # One request for each of its two connections taking part in DROP.
    assert DeletionRequest.objects.filter(integration=integration).count() == 2


def test_a_saas_connection_retired_while_an_import_removes_one_of_its_items_ends_both(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import cancels the queued SaaS deletion of an item DROP removed: the retirement
    must not hold that deletion while it waits for the import."""
    mailer = SaasConnectionFactory.create(broker=broker, url="http://127.0.0.1:9/erase")
    webhook_integration_created(broker, "http://127.0.0.1:9/d")
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    drop_zip_import(
        broker=broker,
        path=_package(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS),
        actor="test",
    )
    resolution = ResolutionRequest.objects.get()
    deletion = SaasDeletionFactory.create(
        resolution=resolution, saas_connection=mailer, state=RequestState.QUEUED
    )
    removed = [
        (WorkItem.objects.get(pk=resolution.work_item_id).work_item_id, ITEMS[0][1], "Email")
    ]
    package = _package(broker, tmp_path, "20261121_4821_DROP.zip", Email=[], removed=removed)

    errors = _during_import(
        monkeypatch,
        broker,
        package,
        lambda: saas_connection_retire(connection=mailer, reason="replaced", actor="test"),
    )

    assert errors == []
    assert SaasConnection.objects.get(pk=mailer.pk).retired_at is not None
    deletion = SaasDeletion.objects.get(pk=deletion.pk)
    assert deletion.state == RequestState.CANCELLED
    assert "removed by DROP" in deletion.last_error


# -- work items: one order for every transaction that settles several -------------------------


def _while_a_batch_settles(
    monkeypatch: pytest.MonkeyPatch,
    deliver: Callable[[], object],
    staff_action: Callable[[], object],
    settlement: str = "resolution_settle",
) -> list[BaseException]:
    """``deliver`` a batch; once it ran its first ``settlement`` (of the deliveries module:
    a SaaS deletion's, or an ISI answer's record), its work item locked, run ``staff_action``
    until it waits for a row; then let the batch settle the others. The errors of either."""
    settled, release = threading.Event(), threading.Event()
    settle = getattr(deliveries, settlement)

    def settle_then_hold(**kwargs: Any) -> Any:
        result = settle(**kwargs)
        if not settled.is_set():
            settled.set()
            release.wait(30)
        return result

    monkeypatch.setattr(deliveries, settlement, settle_then_hold)
    errors: list[BaseException] = []
    try:
        delivering = in_thread(deliver, errors)
        assert settled.wait(30), "the batch settled nothing"
        acting = in_thread(staff_action, errors)
        wait_until(
            lambda: sessions_waiting_for_locks() >= 1, "the staff action did not wait for a row"
        )
    finally:
        release.set()
    delivering.join(60)
    acting.join(60)
    assert not delivering.is_alive() and not acting.is_alive()
    return errors


def test_a_saas_batch_settling_items_while_their_integration_is_retired_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch settles the work item of each deletion it completed, the retirement those of
    the integration's requests: two items both settle, each must take them in one order."""
    with BrokerSimulator() as mailer_api:
        crm = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
        first, second = WorkItemFactory.create_batch(2, cycle__broker=broker)
        for item in (first, second):
            DeletionRequestFactory.create(integration=crm, work_item=item, dispatched=True)
        resolutions = [
            ResolutionRequestFactory.create(integration=crm, work_item=item, resolved=True)
            for item in (first, second)
        ]
        mailer = SaasConnectionFactory.create(broker=broker, url=mailer_api.url)
        # The second item's identifiers were answered first: its deletion comes first.
        deletions = [
            SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer)
            for resolution in reversed(resolutions)
        ]

        errors = _while_a_batch_settles(
            monkeypatch,
            lambda: saas_deletions_deliver(deletion_ids=[d.pk for d in deletions]),
            lambda: integration_retire(integration=crm, reason="replaced", actor="test"),
        )

    assert errors == []
    assert set(SaasDeletion.objects.values_list("state", flat=True)) == {RequestState.COMPLETED}
    assert Integration.objects.get(pk=crm.pk).retired_at is not None
    states = DeletionRequest.objects.filter(integration=crm).values_list("state", flat=True)
    assert set(states) == {RequestState.CANCELLED}


def test_an_isi_batch_recording_answers_while_another_integration_is_retired_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ISI integration answers identifier retrievals at once: the batch records each answer,
    which settles its work item, while the retirement settles the items of the requests of the
    integration it retires."""
    answer = {"email": [{"email": "ann@example.com"}]}
    with IsiSimulator(
        connections=broker_connections(), token="static-t0ken", identifiers={"C-1": answer}
    ) as api:
        isi = isi_integration_created(broker, api, oauth=False).integration
        crm = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
        SaasConnectionFactory.create(broker=broker, url="http://127.0.0.1:9/erase")
        first, second = WorkItemFactory.create_batch(2, cycle__broker=broker)
        for item in (first, second):
            DeletionRequestFactory.create(integration=crm, work_item=item, dispatched=True)
        # The second item's retrieval was made first (the first item matched later).
        connection_a = isi.connections.get(uuid=CONNECTION_A)
        retrievals = [
            ResolutionRequestFactory.create(
                isi_connection=connection_a, work_item=item, remote_identifier="C-1"
            )
            for item in (second, first)
        ]

        errors = _while_a_batch_settles(
            monkeypatch,
            lambda: resolution_requests_deliver(request_ids=[r.pk for r in retrievals]),
            lambda: integration_retire(integration=crm, reason="replaced", actor="test"),
            settlement="resolution_outcome_record",
        )

    assert errors == []
    answered = ResolutionRequest.objects.filter(pk__in=[r.pk for r in retrievals])
    assert set(answered.values_list("state", flat=True)) == {RequestState.COMPLETED}
    assert Integration.objects.get(pk=crm.pk).retired_at is not None


def test_a_saas_batch_settling_items_while_another_saas_connection_is_retired_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both settle the resolutions of their deletions, each with its work item: the batch those
    of the deletions it completed, the retirement those of the deletions it cancelled."""
    with BrokerSimulator() as mailer_api:
        crm = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
        first, second = WorkItemFactory.create_batch(2, cycle__broker=broker)
        # The second item's retrieval was made first (the first item matched later), and
        # answered last.
        of_second, of_first = (
            ResolutionRequestFactory.create(integration=crm, work_item=item, resolved=True)
            for item in (second, first)
        )
        mailer = SaasConnectionFactory.create(broker=broker, url=mailer_api.url)
        newsletter = SaasConnectionFactory.create(
            broker=broker, name="Newsletter", url="http://127.0.0.1:9/erase"
        )
        mailed = []
        for resolution in (of_first, of_second):
            mailed.append(SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer))
            SaasDeletionFactory.create(resolution=resolution, saas_connection=newsletter)

        errors = _while_a_batch_settles(
            monkeypatch,
            lambda: saas_deletions_deliver(deletion_ids=[d.pk for d in mailed]),
            lambda: saas_connection_retire(connection=newsletter, reason="replaced", actor="test"),
        )

    assert errors == []
    assert set(
        SaasDeletion.objects.filter(saas_connection=mailer).values_list("state", flat=True)
    ) == {RequestState.COMPLETED}
    assert set(
        SaasDeletion.objects.filter(saas_connection=newsletter).values_list("state", flat=True)
    ) == {RequestState.CANCELLED}
    assert SaasConnection.objects.get(pk=newsletter.pk).retired_at is not None


def _registered_late(broker: Broker, *items: WorkItem) -> Callable[[], object]:
    """A registration (the API's) of one new consumer per item, each with its item's hash:
    the same people come back, from a supplier say, and are matched late."""
    records = [
        {"remote_identifier": f"R-{item.pk}", "hashes": {"email": [b64encode(item.hash).decode()]}}
        for item in items
    ]
    return lambda: consumers_register(
        broker=broker, records=parse_api_consumers(records), actor="test", source="api"
    )


def test_a_saas_batch_settling_items_while_a_late_match_takes_them_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch settles its two items by id; the late match of both updates the second (a
    status staff set while its deletions were out goes back to open) and checks the first,
    at its commit, for the foreign key of its new request. Each must take them in one
    order."""
    with BrokerSimulator() as mailer_api:
        crm = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
        mailer = SaasConnectionFactory.create(broker=broker, url=mailer_api.url)
        first, second = WorkItemFactory.create_batch(2, cycle__broker=broker)
        deletions = []
        for item in (first, second):
            DeletionRequestFactory.create(integration=crm, work_item=item, dispatched=True)
            resolution = ResolutionRequestFactory.create(
                integration=crm, work_item=item, resolved=True
            )
            deletions.append(
                SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer)
            )
        work_item_status_set(work_item=second, status_code=3, reason="CRM down", actor="test")

        errors = _while_a_batch_settles(
            monkeypatch,
            lambda: saas_deletions_deliver(deletion_ids=[d.pk for d in deletions]),
            _registered_late(broker, first, second),
        )

    assert errors == []
    assert set(SaasDeletion.objects.values_list("state", flat=True)) == {RequestState.COMPLETED}
    assert DeletionRequest.objects.filter(late_match=True).count() == 2


def _statuses_set_while_mailed(
    broker: Broker, mailer_url: str, **reported: Any
) -> tuple[WorkItem, WorkItem, list[SaasDeletion]]:
    """Two items of one cycle, each with its SaaS deletion queued, and a status staff set by
    hand meanwhile (reportable, their requests still open). The first by our id is the
    second by DROP's work item id (which need not follow ours), and its status was set
    last: its row now lies after the second's. ``reported``: what DROP held before (the
    status set then owes an amendment)."""
    crm = webhook_integration_created(broker, "http://127.0.0.1:9/d").integration
    mailer = SaasConnectionFactory.create(broker=broker, url=mailer_url)
    first = WorkItemFactory.create(cycle__broker=broker, work_item_id="zzzzzzzzzzzz", **reported)
    second = WorkItemFactory.create(cycle=first.cycle, work_item_id="AAAAAAAAAAAA", **reported)
    deletions = []
    for item in (first, second):
        DeletionRequestFactory.create(integration=crm, work_item=item, dispatched=True)
        resolution = ResolutionRequestFactory.create(integration=crm, work_item=item, resolved=True)
        deletions.append(SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer))
    for item in (second, first):
        work_item_status_set(work_item=item, status_code=3, reason="CRM down", actor="test")
    return first, second, deletions


def test_a_saas_batch_settling_items_while_their_file_is_not_approved_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staff who review the broker's uploads reject the file: its rows leave it, in the
    order the plan reads them; the batch settles the same two items by id."""
    broker_update(broker=broker, approve_uploads=True, actor="staff:carol")
    with BrokerSimulator() as mailer_api:
        first, _, deletions = _statuses_set_while_mailed(broker, mailer_api.url)
        (written,) = report_files_write(broker=broker, cycle=first.cycle, actor="staff:alice")

        errors = _while_a_batch_settles(
            monkeypatch,
            lambda: saas_deletions_deliver(deletion_ids=[d.pk for d in deletions]),
            lambda: report_file_reject(report_file=written, reason="redo", actor="staff:bob"),
        )

    assert errors == []
    assert set(SaasDeletion.objects.values_list("state", flat=True)) == {RequestState.COMPLETED}
    assert ReportFile.objects.get(pk=written.pk).state == ReportFileState.NOT_APPROVED
    assert set(WorkItem.objects.values_list("pending_report_file", flat=True)) == {None}


def test_a_saas_batch_settling_items_while_their_amendment_is_given_up_ends_both(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DROP rejected the amendment of two items it held as 4; staff give it up, which moves
    its rows back in the order the plan reads them; the batch settles them by id."""
    with BrokerSimulator() as mailer_api:
        first, _, deletions = _statuses_set_while_mailed(
            broker, mailer_api.url, reported=True, status_code=4
        )
        (amendment,) = report_files_write(broker=broker, cycle=first.cycle, actor="test")
        assert amendment.kind == ReportKind.AMEND
        ReportFile.objects.filter(pk=amendment.pk).update(state=ReportFileState.REJECTED)

        errors = _while_a_batch_settles(
            monkeypatch,
            lambda: saas_deletions_deliver(deletion_ids=[d.pk for d in deletions]),
            lambda: report_file_discard(report_file=amendment, reason="DROP", actor="test"),
        )

    assert errors == []
    assert set(SaasDeletion.objects.values_list("state", flat=True)) == {RequestState.COMPLETED}
    assert ReportFile.objects.get(pk=amendment.pk).state == ReportFileState.DISCARDED


def test_an_import_removing_items_while_drop_takes_their_file_ends_both(
    broker: Broker, drop: DropSimulator, tmp_path: Path
) -> None:
    """DROP takes a file whose rows a new download's Removed list closes, two of them, while
    a callback holds a third (between them by id)."""
    broker_reports_to(broker, drop)
    three = list(work_items(3, start=10))
    drop_zip_import(
        broker=broker,
        path=_package(broker, tmp_path, "20261120_4821_DROP.zip", Email=three),
        actor="test",
    )
    low, middle, high = WorkItem.objects.order_by("pk")
    (written,) = report_files_write(broker=broker, cycle=low.cycle, actor="test")
    hashes = dict(three)
    removed = [(item.work_item_id, hashes[item.work_item_id], "Email") for item in (high, low)]
    package = _package(broker, tmp_path, "20261121_4821_DROP.zip", Email=[], removed=removed)
    client = DropClient(drop.url, drop.api_key, allow_private=True)
    held, release = threading.Event(), threading.Event()

    def callback() -> None:
        with transaction.atomic():
            WorkItem.objects.select_for_update().get(pk=middle.pk)
            held.set()
            release.wait(30)

    errors: list[BaseException] = []
    try:
        holding = in_thread(callback, errors)
        assert held.wait(30)
        uploading = in_thread(
            lambda: report_files_upload(broker=broker, client=client, actor="test"), errors
        )
        wait_until(lambda: sessions_waiting_for_locks() >= 1, "the upload did not wait")
        importing = in_thread(
            lambda: drop_zip_import(broker=broker, path=package, actor="test"), errors
        )
        wait_until(lambda: sessions_waiting_for_locks() >= 2, "the import did not wait")
    finally:
        release.set()
    for thread in (holding, uploading, importing):
        thread.join(60)
        assert not thread.is_alive()

    assert errors == []
    assert ReportFile.objects.get(pk=written.pk).state == ReportFileState.ACCEPTED
    states = dict(WorkItem.objects.values_list("pk", "state"))
    assert states == {
        low.pk: WorkItemState.REMOVED,
        middle.pk: WorkItemState.REPORTED,
        high.pk: WorkItemState.REMOVED,
    }


def test_a_saas_deletion_answered_while_an_import_removes_its_item_ends_both(
    broker: Broker, tmp_path: Path
) -> None:
    """The batch holds its deletion while it is sent and, answered, settles its work item; the
    import removes that item and cancels its deletions not sent."""
    with BrokerSimulator() as mailer_api, _answers_held(mailer_api) as (arrived, release):
        mailer = SaasConnectionFactory.create(broker=broker, url=mailer_api.url)
        webhook_integration_created(broker, "http://127.0.0.1:9/d")
        ConsumerFactory.create(
            broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]}
        )
        drop_zip_import(
            broker=broker,
            path=_package(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS),
            actor="test",
        )
        resolution = ResolutionRequest.objects.get()
        item = WorkItem.objects.get(pk=resolution.work_item_id)
        ResolutionRequest.objects.filter(pk=resolution.pk).update(
            state=RequestState.COMPLETED,
            identifiers=json.dumps({"email": [{"email": "ann@example.com"}]}),
        )
        deletion = SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer)
        removed = [(item.work_item_id, ITEMS[0][1], "Email")]
        package = _package(broker, tmp_path, "20261121_4821_DROP.zip", Email=[], removed=removed)

        errors: list[BaseException] = []
        delivering = in_thread(lambda: saas_deletions_deliver(deletion_ids=[deletion.pk]), errors)
        assert arrived.wait(30), "the deletion did not reach the SaaS"
        importing = in_thread(
            lambda: drop_zip_import(broker=broker, path=package, actor="test"), errors
        )
        wait_until(
            lambda: sessions_waiting_for_locks() >= 1, "the import did not wait for the deletion"
        )
        release.set()
        delivering.join(60)
        importing.join(60)
        assert not delivering.is_alive() and not importing.is_alive()

    assert errors == []
    # Sent before DROP removed the item: the SaaS took it.
    assert SaasDeletion.objects.get(pk=deletion.pk).state == RequestState.COMPLETED
    assert WorkItem.objects.get(pk=item.pk).state == WorkItemState.REMOVED


def test_a_report_written_while_an_import_removes_one_of_its_items_ends_both(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report holds its cycle while it marks the cycle's rows; the import removes one of
    those rows and then asks whether that earlier cycle is reported."""
    drop_zip_import(
        broker=broker,
        path=_package(broker, tmp_path, "20261120_4821_DROP.zip", Email=ITEMS),
        actor="test",
    )
    cycle = DropCycle.objects.get()
    gone, kept = WorkItem.objects.order_by("pk")  # no consumer: both reportable as 5
    removed = [(gone.work_item_id, ITEMS[0][1], "Email")]
    package = _package(broker, tmp_path, "20261121_4821_DROP.zip", Email=[], removed=removed)
    removing, release = threading.Event(), threading.Event()
    refresh = drop_import.cycle_state_refresh

    def removed_then_hold(**kwargs: Any) -> DropCycle:
        removing.set()
        release.wait(30)
        return refresh(**kwargs)

    monkeypatch.setattr(drop_import, "cycle_state_refresh", removed_then_hold)
    errors: list[BaseException] = []
    try:
        importing = in_thread(
            lambda: drop_zip_import(broker=broker, path=package, actor="test"), errors
        )
        assert removing.wait(30), "the import did not remove the item"
        reporting = in_thread(
            lambda: report_files_write(broker=broker, cycle=cycle, actor="test"), errors
        )
        wait_until(lambda: sessions_waiting_for_locks() >= 1, "the report did not wait for a row")
    finally:
        release.set()
    importing.join(60)
    reporting.join(60)
    assert not importing.is_alive() and not reporting.is_alive()

    assert errors == []
    assert WorkItem.objects.get(pk=gone.pk).state == WorkItemState.REMOVED
    # The removed item owes nothing: the file holds the other one.
    assert ReportFile.objects.get(cycle=cycle).rows == 1
    assert WorkItem.objects.get(pk=kept.pk).pending_report_file is not None


# -- enabling a target that is enabled (or is enabled meanwhile) --------------------------------


@pytest.fixture
def job_tables_emptied() -> Iterator[None]:
    def empty() -> None:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE procrastinate_jobs, procrastinate_periodic_defers CASCADE")

    empty()
    yield
    empty()


def _jobs_naming(task: str, argument: str, pk: int) -> int:
    """How many jobs of ``task`` still to run name ``pk``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE task_name = %s AND status = 'todo'"
            " AND args -> %s @> to_jsonb(%s::int)",
            [task, argument, pk],
        )
        return int(cursor.fetchone()[0])


@contextmanager
def _row_held(
    model: type[Integration] | type[SaasConnection], pk: int, *, enable: bool = False
) -> Iterator[None]:
    """``model``'s row ``pk`` held by another transaction (which enables it, with ``enable``)
    until the block ends; then that transaction commits."""
    held, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        with transaction.atomic():
            row = model.objects.select_for_update(of=("self",)).get(pk=pk)
            if enable:
                row.enabled, row.disabled_reason = True, ""
                row.save(update_fields=["enabled", "disabled_reason"])
            held.set()
            release.wait(30)

    holding = in_thread(hold, errors)
    assert held.wait(30), "the row was not taken"
    try:
        yield
    finally:
        release.set()
        holding.join(60)
    assert errors == [] and not holding.is_alive()


def _enable_while_its_batch_runs(
    enable: Callable[[], object], deliver: Callable[[], object], target_held: Any
) -> None:
    """``enable`` while another transaction holds the target's row (until it waits for it or
    ends); the request's delivery job runs meanwhile; then the row is let go."""
    errors: list[BaseException] = []
    with target_held:
        enabling = in_thread(enable, errors)
        wait_until(
            lambda: not enabling.is_alive() or sessions_waiting_for_locks() >= 1,
            "the enable neither ended nor waited",
        )
        deliver()
    enabling.join(60)
    assert errors == [] and not enabling.is_alive()


@pytest.mark.parametrize("enabled_meanwhile", [False, True])
def test_an_integration_enabled_while_its_delivery_job_runs_leaves_no_request_without_a_job(
    broker: Broker, job_tables_emptied: None, enabled_meanwhile: bool
) -> None:
    """Enabling an enabled integration (``integrations enable`` again), or one another member
    of staff enables at the same time: its delivery job, running meanwhile, must not skip a
    request the enable holds and leave it queued with no job."""
    with BrokerSimulator() as simulator:
        integration = webhook_integration_created(broker, simulator.url).integration
        if enabled_meanwhile:
            integration_disable(integration=integration, reason="paused", actor="test")
        request = DeletionRequestFactory.create(integration=integration, state=RequestState.QUEUED)

        _enable_while_its_batch_runs(
            lambda: integration_enable(integration=integration, actor="test"),
            lambda: deletion_requests_deliver(request_ids=[request.pk]),
            _row_held(Integration, integration.pk, enable=enabled_meanwhile),
        )

    request = DeletionRequest.objects.get(pk=request.pk)
    assert request.state != RequestState.QUEUED or _jobs_naming(
        "integrations.tasks.deliver_deletion_requests", "request_ids", request.pk
    )


@pytest.mark.parametrize("enabled_meanwhile", [False, True])
def test_a_saas_connection_enabled_while_its_delivery_job_runs_leaves_no_deletion_without_a_job(
    broker: Broker, job_tables_emptied: None, enabled_meanwhile: bool
) -> None:
    with BrokerSimulator() as simulator:
        deletion = _saas_deletion(broker, simulator.url)
        mailer = deletion.saas_connection
        if enabled_meanwhile:
            saas_connection_disable(connection=mailer, reason="paused", actor="test")

        _enable_while_its_batch_runs(
            lambda: saas_connection_enable(connection=mailer, actor="test"),
            lambda: saas_deletions_deliver(deletion_ids=[deletion.pk]),
            _row_held(SaasConnection, mailer.pk, enable=enabled_meanwhile),
        )

    deletion = SaasDeletion.objects.get(pk=deletion.pk)
    assert deletion.state != RequestState.QUEUED or _jobs_naming(
        "integrations.tasks.deliver_saas_deletions", "deletion_ids", deletion.pk
    )
