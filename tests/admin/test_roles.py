"""Staff roles: what each group may do through the admin (groups from migration 0005).

That an Auditor sees every list and page of the app and changes nothing is checked on the
role table's walk (``tests/admin/test_role_table.py``, ``Walker.auditor_changes_nothing``):
it covers every ModelAdmin registered at the time the tests run, so a new admin is checked
without a new test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db import models
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from integrations.models import (
    ApiKey,
    Broker,
    DeletionRequest,
    LedgerEvent,
)
from integrations.services.staff.keys import CreatedApiKey, api_key_create
from tests.builders import sample_cycle

pytestmark = pytest.mark.django_db

APP_ADMINS = sorted(
    (
        (model, model_admin)
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label == "integrations"
    ),
    key=lambda pair: pair[0]._meta.model_name or "",
)


def admin_url(model: type[models.Model], view: str, *args: object) -> str:
    return reverse(f"admin:integrations_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def a_cycle(broker: Broker) -> None:
    """A cycle's rows: requests, work items, the ledger."""
    sample_cycle(broker, today=timezone.localdate())


def member_of(group: str, client: Client) -> Client:
    user = User.objects.create_user(group.split()[0].lower(), password="pw-123-role", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    client.force_login(user)
    return client


def permissions_of(group: str) -> set[str]:
    return set(Group.objects.get(name=group).permissions.values_list("codename", flat=True))


def test_the_three_roles_hold_the_permissions_the_operations_guide_gives_them() -> None:
    managers = permissions_of("Connections managers")
    assert {"add_broker", "change_integration", "add_apikey", "view_saasconnection"} <= managers
    # Removing a canary is theirs: its own ledger event (canary.removed), not a record's loss.
    deletes = {p for p in managers if p.startswith("delete_")}
    assert not any(p.endswith("deletionrequest") for p in managers)
    assert deletes == {"delete_canary"}

    operators = permissions_of("Operators")
    assert {"change_deletionrequest", "change_workitem", "view_ledgerevent"} <= operators
    assert not {"add_broker", "change_broker", "change_integration", "add_apikey"} & operators

    auditors = permissions_of("Auditors")
    assert {f"view_{model._meta.model_name}" for model, _ in APP_ADMINS} <= auditors
    # Theirs alone: the exports and audit keys (migration 0021).
    theirs = {"export_audit_records", "add_audit_apikey"}
    assert {p for p in auditors if not p.startswith("view_")} == theirs
    assert not theirs & (managers | operators)


def add_key(client: Client, scopes: list[str], broker: Broker | None) -> Any:
    return client.post(
        admin_url(ApiKey, "add"),
        {"broker": broker.pk if broker else "", "name": "k", "scopes": scopes},
    )


def test_only_an_auditor_mints_an_audit_key(client: Client, broker: Broker) -> None:
    manager = member_of("Connections managers", client)
    refused = add_key(manager, ["audit"], broker)
    assert refused.status_code == 200  # the form again, with the error
    assert "audit is not one of the available choices" in refused.content.decode()
    assert add_key(manager, ["ingest"], broker).status_code == 302
    assert add_key(manager, ["metrics"], broker).status_code == 302
    assert not ApiKey.objects.filter(scopes__contains=["audit"]).exists()

    auditor = member_of("Auditors", Client())
    assert add_key(auditor, ["ingest"], broker).status_code == 200  # not theirs to mint
    assert add_key(auditor, ["audit"], broker).status_code == 302
    assert list(
        ApiKey.objects.filter(scopes__contains=["audit"]).values_list("scopes", flat=True)
    ) == [["audit"]]
    created = LedgerEvent.objects.filter(kind="api_key.created").order_by("id")
    assert [e.actor for e in created] == [
        "staff:connections",
        "staff:connections",
        "staff:auditors",
    ]


def test_only_a_superuser_mints_a_metrics_key_without_a_broker(
    client: Client, broker: Broker
) -> None:
    manager = member_of("Connections managers", client)
    assert "This field is required" in add_key(manager, ["metrics"], None).content.decode()

    superuser = User.objects.create_superuser("root", password="pw-123-root")
    client.force_login(superuser)
    refused = add_key(client, ["metrics", "ingest"], None)
    assert "may only have the metrics scope" in refused.content.decode()
    assert add_key(client, ["metrics"], None).status_code == 302
    (key,) = ApiKey.objects.filter(broker__isnull=True)
    assert key.scopes == ["metrics"]
    event = LedgerEvent.objects.get(kind="api_key.created")
    assert (event.broker_id, event.data["every_broker"]) == ("", True)


def test_an_operator_exports_nothing(client: Client, a_cycle: None) -> None:
    operator = member_of("Operators", client)
    request = DeletionRequest.objects.first()
    assert request is not None
    events = LedgerEvent.objects.count()

    assert operator.post(reverse("admin:evidence"), {}).status_code == 403
    export = reverse("admin:integrations_ledgerevent_export", args=["csv"])
    assert operator.post(export).status_code == 403
    listed = operator.post(
        admin_url(DeletionRequest, "changelist"),
        {"action": "export_outcomes_csv", "_selected_action": [request.pk], "index": 0},
    )
    assert listed.status_code == 302  # "No action selected.": not offered, not run
    assert LedgerEvent.objects.count() == events
    page = operator.get(admin_url(LedgerEvent, "changelist")).content.decode()
    assert "Export CSV" not in page


def test_an_auditor_cannot_revoke_a_key(
    client: Client, make_key: Callable[..., CreatedApiKey]
) -> None:
    key = make_key("webhook_callback").api_key
    member_of("Auditors", client).post(
        admin_url(ApiKey, "changelist"), {"action": "revoke_keys", "_selected_action": [key.pk]}
    )
    key.refresh_from_db()
    assert key.revoked_at is None


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_a_connections_manager_revokes_only_the_keys_they_could_add(
    client: Client, broker: Broker, make_key: Callable[..., CreatedApiKey]
) -> None:
    theirs = make_key("webhook_callback").api_key
    audit = make_key("audit").api_key  # an Auditor's
    every_broker = api_key_create(broker=None, scopes=["metrics"], actor="staff:root").api_key
    manager = member_of("Connections managers", client)
    answer = manager.post(
        admin_url(ApiKey, "changelist"),
        {"action": "revoke_keys", "_selected_action": [theirs.pk, audit.pk, every_broker.pk]},
        follow=True,
    )
    revoked = set(ApiKey.objects.filter(revoked_at__isnull=False).values_list("pk", flat=True))
    assert revoked == {theirs.pk}
    shown = [str(m) for m in answer.context["messages"]]
    assert "Revoked 1 key(s)." in shown
    (skipped,) = [m for m in shown if m.startswith("Not revoked")]
    assert audit.prefix in skipped and every_broker.prefix in skipped
    assert [e.subject for e in LedgerEvent.objects.filter(kind="api_key.revoked")] == [
        theirs.prefix
    ]


def test_a_superuser_revokes_every_key(
    client: Client, make_key: Callable[..., CreatedApiKey]
) -> None:
    keys = [
        make_key("webhook_callback").api_key,
        make_key("audit").api_key,
        api_key_create(broker=None, scopes=["metrics"], actor="staff:root").api_key,
    ]
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-123"))
    client.post(
        admin_url(ApiKey, "changelist"),
        {"action": "revoke_keys", "_selected_action": [key.pk for key in keys]},
    )
    assert not ApiKey.objects.filter(revoked_at__isnull=True).exists()
    assert LedgerEvent.objects.filter(kind="api_key.revoked").count() == 3


def test_a_connections_manager_adds_a_broker_but_not_a_user(client: Client) -> None:
    manager = member_of("Connections managers", client)
    response = manager.post(
        admin_url(Broker, "add"),
        {
            "broker_id": "4821",
            "name": "Acme",
            "mode": "test",
            "drop_base_url": "",
            "drop_api_key": "",
            "pull_interval_days": 30,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert LedgerEvent.objects.get(kind="broker.created").actor == "staff:connections"
    assert manager.get(reverse("admin:auth_user_add")).status_code == 403


def test_an_operator_reads_the_cycle_but_cannot_touch_connections(
    client: Client, a_cycle: None
) -> None:
    operator = member_of("Operators", client)
    broker = Broker.objects.get()
    assert operator.get(admin_url(Broker, "changelist")).status_code == 200
    assert operator.post(admin_url(Broker, "change", broker.pk), {}).status_code == 403
    assert operator.get(admin_url(ApiKey, "add")).status_code == 403
