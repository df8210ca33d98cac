"""A disabled target is paused, not gone; a retired one is gone for good.

A broker with two systems: while the second is disabled (by staff or by a 410), matches still
ask it to delete their consumers. Its requests wait (no attempt is made, so none is burnt)
and their work items are not reportable until it answers; enabling it sends them. Retiring
a target (``integrations retire``, ``saas retire``, the admin actions) cancels its open
requests with the reason, their work items settle on their other requests, or wait for a
target when none is left; it can never be enabled again.

Matching runs as operators run it (``drop import``); outcomes are recorded by the services the
callbacks call.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone

from devtools.drop_simulator import work_items
from integrations.models import (
    Broker,
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)
from integrations.services.dispatch.deliveries import (
    deletion_requests_deliver,
    saas_deletions_deliver,
)
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.dispatch.resolutions import resolution_outcome_record
from integrations.services.staff.alerts import CONDITIONS
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    webhook_integration_create,
)
from integrations.services.staff.saas import saas_connection_disable, saas_connection_enable
from tests.builders import (
    ConsumerFactory,
    SaasConnectionFactory,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(3))


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _target(broker: Broker, name: str) -> Integration:
    # Port 9 (discard): a delivery that were attempted would fail and be recorded.
    return webhook_integration_create(
        broker=broker, name=name, url=f"http://127.0.0.1:9/{name}", actor="test"
    ).integration


def _import(broker: Broker, tmp_path: Path, name: str = "20261120_4821_DROP.zip", **lists: Any):
    package = write_zip(tmp_path, drop_zip(broker, lists or {"Email": ITEMS[:1]}), name=name)
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())


def _item() -> WorkItem:
    return WorkItem.objects.get(work_item_id=ITEMS[0][0])


def _request(integration: Integration | None) -> DeletionRequest:
    return DeletionRequest.objects.get(work_item=_item(), integration=integration)


@pytest.fixture
def two_targets(broker: Broker) -> tuple[Integration, Integration]:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    return _target(broker, "crm"), _target(broker, "warehouse")


def test_a_match_while_one_of_two_targets_is_disabled_waits_for_it(
    broker: Broker, two_targets: tuple[Integration, Integration], tmp_path: Path
) -> None:
    crm, warehouse = two_targets
    integration_disable(integration=warehouse, reason="410 Gone", actor="test")

    _import(broker, tmp_path)

    # The paused system is still asked: its request waits, and no attempt is burnt on it.
    waiting = _request(warehouse)
    assert waiting.state == RequestState.QUEUED
    deletion_requests_deliver(request_ids=[waiting.pk])
    waiting.refresh_from_db()
    assert (waiting.state, waiting.attempts) == (RequestState.QUEUED, 0)
    assert not DeliveryAttempt.objects.filter(deletion_request=waiting).exists()

    # The other system deleting is not enough: DROP is not told while one owes an answer.
    deletion_outcome_record(deletion_request=_request(crm), drop_outcome="deleted", actor="t")
    assert (_item().state, _item().status_code) == (WorkItemState.OPEN, None)

    # Enabling sends it; its answer settles the item.
    assert integration_enable(integration=warehouse, actor="test") == 1
    deletion_outcome_record(
        deletion_request=_request(warehouse), drop_outcome="not_found", actor="t"
    )
    assert (_item().state, _item().status_code) == (WorkItemState.REPORTABLE, 3)


def test_retiring_a_target_cancels_its_requests_and_the_item_settles_on_the_others(
    broker: Broker, two_targets: tuple[Integration, Integration], tmp_path: Path
) -> None:
    crm, warehouse = two_targets
    integration_disable(integration=warehouse, reason="410 Gone", actor="test")
    _import(broker, tmp_path)
    deletion_outcome_record(deletion_request=_request(crm), drop_outcome="deleted", actor="t")

    out = io.StringIO()
    call_command(
        "integrations", "retire", str(warehouse.uuid), "--reason", "warehouse decommissioned",
        "--json", stdout=out,
    )  # fmt: skip

    shown = json.loads(out.getvalue())
    assert (shown["deletion_requests_cancelled"], shown["work_items"]) == (1, 1)
    assert shown["waiting_for_a_target"] == 0
    cancelled = _request(warehouse)
    assert cancelled.state == RequestState.CANCELLED
    assert cancelled.last_error == "target retired: warehouse decommissioned"
    assert (_item().state, _item().status_code) == (WorkItemState.REPORTABLE, 3)
    (event,) = LedgerEvent.objects.filter(kind="integration.retired")
    assert event.subject == str(warehouse.uuid)
    assert event.data["reason"] == "warehouse decommissioned"
    assert event.data["deletion_requests_cancelled"] == 1

    # Final: it cannot be enabled again, and it is no target for the next match.
    with pytest.raises(CommandError, match="retired is final"):
        call_command("integrations", "enable", str(warehouse.uuid))
    with pytest.raises(CommandError, match="already retired"):
        call_command("integrations", "retire", str(warehouse.uuid), "--reason", "again")
    with pytest.raises(IntegrityError), transaction.atomic():
        Integration.objects.filter(pk=warehouse.pk).update(enabled=True)
    ConsumerFactory.create(broker=broker, remote_identifier="C-2", hashes={"email": ITEMS[1][1]})
    _import(broker, tmp_path, "20270104_4821_DROP.zip", Email=ITEMS[1:2])
    later = DeletionRequest.objects.filter(remote_identifier="C-2")
    assert [r.integration_id for r in later] == [crm.pk]
    # Gone by staff's decision: not an integration "disabled" that waits for someone.
    assert not list(CONDITIONS["integration_disabled"](timezone.now()))


def test_an_answer_given_before_its_target_was_retired_still_settles_the_item(
    broker: Broker, two_targets: tuple[Integration, Integration], tmp_path: Path
) -> None:
    # Found by the lifecycle model: both targets retired, the first after it answered.
    crm, warehouse = two_targets
    _import(broker, tmp_path)
    deletion_outcome_record(deletion_request=_request(crm), drop_outcome="deleted", actor="t")
    deletion_outcome_record(
        deletion_request=_request(warehouse), drop_outcome="failed", actor="t",
        error_message="CRM locked",
    )  # fmt: skip
    for target in (crm, warehouse):
        call_command(
            "integrations", "retire", str(target.uuid), "--reason", "moved", stdout=io.StringIO()
        )

    # The deletion happened: DROP is told so, and no request waits for a new target.
    assert _request(warehouse).state == RequestState.CANCELLED
    assert not DeletionRequest.objects.filter(state=RequestState.PENDING).exists()
    last_retired = LedgerEvent.objects.filter(kind="integration.retired").latest("pk")
    assert last_retired.data["waiting_for_a_target"] == 0
    assert (_item().state, _item().status_code) == (WorkItemState.REPORTABLE, 3)


def test_retire_needs_a_reason(broker: Broker) -> None:
    crm = _target(broker, "crm")
    with pytest.raises(CommandError, match="--reason"):
        call_command("integrations", "retire", str(crm.uuid))
    with pytest.raises(CommandError, match="say why"):
        call_command("integrations", "retire", str(crm.uuid), "--reason", "  ")
    crm.refresh_from_db()
    assert (crm.enabled, crm.retired_at) == (True, None)
    assert not LedgerEvent.objects.filter(kind="integration.retired").exists()


def test_a_reason_longer_than_its_column_is_refused_not_cut(broker: Broker) -> None:
    """A reason kept in part says something else: refused in one line, nothing changed."""
    crm = _target(broker, "crm")
    mailer = SaasConnectionFactory.create(broker=broker, name="Mailer")
    refusals = [
        (["integrations", "disable", str(crm.uuid), "--reason", "d" * 201], 200, 201),
        (["integrations", "retire", str(crm.uuid), "--reason", "r" * 501], 500, 501),
        (["saas", "retire", str(mailer.pk), "--reason", "r" * 501], 500, 501),
    ]
    for args, limit, given in refusals:
        with pytest.raises(
            CommandError, match=rf"^reason: at most {limit} characters, not {given}$"
        ):
            call_command(*args, stdout=io.StringIO())
    crm.refresh_from_db()
    mailer.refresh_from_db()
    assert (crm.enabled, crm.retired_at, mailer.retired_at) == (True, None, None)
    with pytest.raises(ValidationError, match="at most 200 characters"):
        saas_connection_disable(connection=mailer, reason="d" * 201, actor="test")
    assert SaasConnection.objects.get(pk=mailer.pk).enabled
    assert not LedgerEvent.objects.filter(kind__endswith="retired").exists()
    # At its column's width, kept whole.
    call_command(
        "integrations", "disable", str(crm.uuid), "--reason", "d" * 200, stdout=io.StringIO()
    )
    crm.refresh_from_db()
    assert crm.disabled_reason == "d" * 200


def test_retiring_the_only_target_leaves_the_match_waiting_for_a_target(
    broker: Broker, tmp_path: Path
) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    crm = _target(broker, "crm")
    _import(broker, tmp_path)

    call_command("integrations", "retire", str(crm.uuid), "--reason", "moved", stdout=io.StringIO())

    # Not "no match" (status 5): the consumer is still owed a deletion by some target.
    assert _request(crm).state == RequestState.CANCELLED
    waiting = _request(None)
    assert (waiting.state, waiting.remote_identifier) == (RequestState.PENDING, "C-1")
    assert (_item().state, _item().status_code) == (WorkItemState.OPEN, None)
    assert LedgerEvent.objects.get(kind="integration.retired").data["waiting_for_a_target"] == 1

    # The broker's new system gets it.
    new = _target(broker, "new-crm")
    waiting.refresh_from_db()
    assert (waiting.state, waiting.integration_id) == (RequestState.QUEUED, new.pk)


def test_a_disabled_saas_connection_still_gets_its_deletion_and_retiring_it_settles(
    broker: Broker, tmp_path: Path
) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    crm = _target(broker, "crm")
    mailer = SaasConnectionFactory.create(
        broker=broker, url="http://127.0.0.1:9/erase", name="Mailer"
    )
    saas_connection_disable(connection=mailer, reason="410 Gone", actor="test")
    _import(broker, tmp_path)
    resolution = ResolutionRequest.objects.get()  # asked although its only SaaS is paused
    resolution_outcome_record(
        resolution_request=resolution,
        drop_outcome="",
        exemption_basis="",
        identifiers={"email": [{"email": "Ann@Example.com"}]},
        actor="t",
    )
    deletion_outcome_record(deletion_request=_request(crm), drop_outcome="deleted", actor="t")

    # The paused SaaS connection's deletion waits: held, no attempt, the item not reportable.
    saas = SaasDeletion.objects.get()
    assert (saas.saas_connection_id, saas.state) == (mailer.pk, RequestState.QUEUED)
    saas_deletions_deliver(deletion_ids=[saas.pk])
    assert not DeliveryAttempt.objects.exists()
    assert (_item().state, _item().status_code) == (WorkItemState.OPEN, None)

    out = io.StringIO()
    call_command(
        "saas", "retire", str(mailer.pk), "--reason", "contract ended", "--json", stdout=out
    )

    assert json.loads(out.getvalue())["deletions_cancelled"] == 1
    saas.refresh_from_db()
    assert (saas.state, saas.last_error) == (
        RequestState.CANCELLED,
        "target retired: contract ended",
    )
    resolution.refresh_from_db()
    assert resolution.identifiers == "" and resolution.identifiers_purged_at is not None
    assert (_item().state, _item().status_code) == (WorkItemState.REPORTABLE, 3)
    assert LedgerEvent.objects.filter(kind="saas_connection.retired").count() == 1
    with pytest.raises(ValidationError, match="retired is final"):
        saas_connection_enable(connection=mailer, actor="test")  # what ticking "enabled" calls


def test_an_answer_for_a_removed_work_item_starts_no_saas_deletion(
    broker: Broker, tmp_path: Path
) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    _target(broker, "crm")
    SaasConnectionFactory.create(broker=broker, url="http://127.0.0.1:9/erase", name="Mailer")
    _import(broker, tmp_path)
    resolution = ResolutionRequest.objects.get()
    ResolutionRequest.objects.filter(pk=resolution.pk).update(state=RequestState.DISPATCHED)
    # DROP's next package removes it (the consumer cancelled); the retrieval was out already.
    removed = [(ITEMS[0][0], ITEMS[0][1], "Email")]
    package = write_zip(
        tmp_path,
        drop_zip(broker, {"Email": []}, removed, date="20270104"),
        name="20270104_4821_DROP.zip",
    )
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())
    assert _item().state == WorkItemState.REMOVED

    resolution_outcome_record(
        resolution_request=resolution,
        drop_outcome="",
        exemption_basis="",
        identifiers={"email": [{"email": "Ann@Example.com"}]},
        actor="t",
    )

    assert not SaasDeletion.objects.exists()
    resolution.refresh_from_db()
    assert resolution.identifiers == ""  # nothing kept for a deletion that will not happen
    event = LedgerEvent.objects.get(kind="resolution_request.outcome_recorded")
    assert event.data["saas_deletions"] == [] and event.data["work_item_removed"] is True


def test_staff_retire_in_the_admin_with_a_written_reason(
    broker: Broker, two_targets: tuple[Integration, Integration], admin_client: Client
) -> None:
    _, warehouse = two_targets
    mailer = SaasConnectionFactory.create(
        broker=broker, url="http://127.0.0.1:9/erase", name="Mailer"
    )
    changelist = "/admin/integrations/integration/"
    chosen = {"action": "retire_integrations", "_selected_action": [warehouse.pk]}

    asked = admin_client.post(changelist, chosen)
    assert asked.status_code == 200 and "Retire for good" in asked.content.decode()
    warehouse.refresh_from_db()
    assert warehouse.retired_at is None  # nothing happens before the reason is given

    admin_client.post(changelist, {**chosen, "apply": "1", "reason": "decommissioned"})
    admin_client.post(
        "/admin/integrations/saasconnection/",
        {"action": "retire_connections", "_selected_action": [mailer.pk], "apply": "1",
         "reason": "contract ended"},
    )  # fmt: skip

    warehouse.refresh_from_db()
    assert (warehouse.enabled, warehouse.retired_reason) == (False, "decommissioned")
    assert SaasConnection.objects.get(pk=mailer.pk).retired_reason == "contract ended"
    assert LedgerEvent.objects.get(kind="integration.retired").actor.startswith("staff:")


# 06:30 UTC on November 26 is 22:30 on November 25 in DROP's zone (Los Angeles).
RETIRED_AT = dt.datetime(2026, 11, 26, 6, 30, tzinfo=dt.UTC)
RETIRED_TEXT = "2026-11-25 22:30 PST"


def test_a_retired_targets_messages_say_the_time_in_drops_zone(
    broker: Broker, admin_client: Client
) -> None:
    crm = _target(broker, "crm")
    mailer = SaasConnectionFactory.create(
        broker=broker, url="http://127.0.0.1:9/erase", name="Mailer"
    )
    call_command("integrations", "retire", str(crm.uuid), "--reason", "moved", stdout=io.StringIO())
    call_command("saas", "retire", str(mailer.pk), "--reason", "ended", stdout=io.StringIO())
    Integration.objects.filter(pk=crm.pk).update(retired_at=RETIRED_AT)
    SaasConnection.objects.filter(pk=mailer.pk).update(retired_at=RETIRED_AT)

    for command in (
        ["integrations", "enable", str(crm.uuid)],
        ["integrations", "retire", str(crm.uuid), "--reason", "again"],
        ["saas", "retire", str(mailer.pk), "--reason", "again"],
    ):
        with pytest.raises(CommandError, match=f"retired on {RETIRED_TEXT}"):
            call_command(*command)
    with pytest.raises(ValidationError, match=f"retired on {RETIRED_TEXT}"):
        saas_connection_enable(connection=mailer, actor="test")
    # The admin's retire action names the one already retired the same way.
    page = admin_client.post(
        "/admin/integrations/integration/",
        {"action": "retire_integrations", "_selected_action": [crm.pk], "apply": "1",
         "reason": "again"},
        follow=True,
    ).content.decode()  # fmt: skip
    assert f"already retired on {RETIRED_TEXT}" in page


def test_saas_retire_takes_the_uuid_saas_list_shows_or_the_id(broker: Broker) -> None:
    mailer = SaasConnectionFactory.create(
        broker=broker, url="http://127.0.0.1:9/erase", name="Mailer"
    )
    other = SaasConnectionFactory.create(
        broker=broker, url="http://127.0.0.1:9/forget", name="Other"
    )
    listed = io.StringIO()
    call_command("saas", "list", stdout=listed)
    (shown, *_) = listed.getvalue().split()
    assert shown == str(mailer.uuid)
    call_command("saas", "retire", shown, "--reason", "ended", stdout=io.StringIO())
    assert SaasConnection.objects.get(pk=mailer.pk).retired_reason == "ended"
    # The numeric id, as earlier versions listed it, still names one.
    call_command("saas", "retire", str(other.pk), "--reason", "gone", stdout=io.StringIO())
    assert SaasConnection.objects.get(pk=other.pk).retired_reason == "gone"
    # A UUID written with digits only and no hyphens is a UUID, not an id.
    digits = SaasConnectionFactory.create(broker=broker, url="http://127.0.0.1:9/d", name="D")
    SaasConnection.objects.filter(pk=digits.pk).update(uuid="12345678" * 4)
    call_command("saas", "retire", "12345678" * 4, "--reason", "digits", stdout=io.StringIO())
    assert SaasConnection.objects.get(pk=digits.pk).retired_reason == "digits"
    for not_an_id in ("6a1f0b4e-0000-4000-8000-000000000000", "²"):  # "²": isdigit(), not int()
        with pytest.raises(CommandError, match=r"see: manage\.py saas list"):
            call_command("saas", "retire", not_an_id, "--reason", "x")
