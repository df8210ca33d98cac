"""Every admin action is a ledger event with the staff user as its actor (docs/operations.md).

Walks the actions every ModelAdmin of the app offers a superuser when the tests run (Django's
``delete_selected`` too, where deleting is allowed), runs each on every row of its model
as a superuser, and expects at least one new ledger event by ``staff:<username>``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from axes.models import AccessAttempt
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection, models
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    Integration,
    LedgerEvent,
    ReportFileState,
    ReportKind,
)
from integrations.services.staff.keys import CreatedApiKey
from tests.builders import (
    INTEGRATION_FACTORIES,
    CanaryFactory,
    DirectiveFactory,
    ReportFileFactory,
    SampleCycle,
    ServiceProviderFactory,
    sample_cycle,
)

pytestmark = pytest.mark.django_db


def _offered_actions() -> list[tuple[type[models.Model], str]]:
    request = RequestFactory().get("/admin/")
    request.user = User(is_superuser=True, is_staff=True, is_active=True)
    return sorted(
        (
            (model, name)
            for model, model_admin in admin.site._registry.items()
            if model._meta.app_label == "integrations"
            for name in model_admin.get_actions(request)
        ),
        key=lambda pair: (pair[0]._meta.model_name or "", pair[1]),
    )


ACTIONS = _offered_actions()
# The lists of integrations, one a kind and the list of every kind: all have
# ``IntegrationAdmin``'s actions, a kind added later too.
INTEGRATION_ACTIONS: list[tuple[type[Integration], str]] = [
    (model, name) for model, name in ACTIONS if issubclass(model, Integration)
]

# Actions that ask for input on an intermediate page, and what staff would enter there.
ACTION_INPUT: dict[str, dict[str, str]] = {
    "workitem.set_work_item_status": {
        "apply": "1",
        "status_code": "3",
        "reason": "deleted by hand after a call",
    },
    "reportfile.discard_amendment": {"apply": "1", "reason": "DROP closed the cycle"},
    "reportfile.approve_files": {"apply": "1", "reason": ""},
    "reportfile.reject_files": {"apply": "1", "reason": "the counts are off"},
    "reportfile.mark_uploaded": {"apply": "1", "uploaded_at": ""},
    "saasconnection.retire_connections": {"apply": "1", "reason": "contract ended"},
    "directive.acknowledge_directives": {"apply": "1", "reference": "letter of May 2"},
} | {
    f"{model._meta.model_name}.{name}": {"apply": "1", "reason": "target decommissioned"}
    for model, name in INTEGRATION_ACTIONS
    if name == "retire_integrations"
}


def _refused_amendment(world: SampleCycle) -> None:
    ReportFileFactory.create(
        cycle=world.previous,
        kind=ReportKind.AMEND,
        file_name=f"{world.previous.match_date:%Y%m%d}_{world.broker.broker_id}_Email_amend01.csv",
        sha256="2" * 64,
        state=ReportFileState.REFUSED,
    )


def _awaiting_approval(world: SampleCycle) -> None:
    """A file another person wrote, waiting for approval (the broker's "approve uploads")."""
    ReportFileFactory.create(
        cycle=world.previous,
        file_name=f"{world.previous.match_date:%Y%m%d}_{world.broker.broker_id}_Email_part09.csv",
        state=ReportFileState.AWAITING_APPROVAL,
        written_by="staff:bob",
    )


def _directive(world: SampleCycle) -> None:
    DirectiveFactory.create(provider=ServiceProviderFactory.create(broker=world.broker))


def _directive_not_written(world: SampleCycle) -> None:
    provider = ServiceProviderFactory.create(broker=world.broker, s3_prefix="s3://mailhouse/drop/")
    DirectiveFactory.create(provider=provider, delivery_error="NoSuchBucket")


def _canary(world: SampleCycle) -> None:
    CanaryFactory.create(broker=world.broker)


def _a_row_of_its_kind(kind: str) -> Callable[[SampleCycle], None]:
    """A row of the kind for its list's actions, unless the sample cycle has one."""

    def setup(world: SampleCycle) -> None:
        if not Integration.objects.filter(kind=kind).exists():
            assert kind in INTEGRATION_FACTORIES, (
                f"no factory for the {kind!r} integrations in tests/builders.py "
                "INTEGRATION_FACTORIES"
            )
            INTEGRATION_FACTORIES[kind].create(broker=world.broker, name=f"Acme {kind}")

    return setup


# Actions that need a row in a state the sample cycle does not have.
ACTION_SETUP: dict[str, Callable[[SampleCycle], None]] = {
    "reportfile.discard_amendment": _refused_amendment,
    "reportfile.approve_files": _awaiting_approval,
    "reportfile.reject_files": _awaiting_approval,
    "directive.acknowledge_directives": _directive,
    "directive.write_directives_again": _directive_not_written,
    "canary.delete_selected": _canary,
} | {
    f"{model._meta.model_name}.{name}": _a_row_of_its_kind(model.KIND)
    for model, name in INTEGRATION_ACTIONS
    if model.KIND  # a kind's proxy; the list of every kind has the sample's rows
}


@pytest.mark.parametrize(
    ("model", "action"), ACTIONS, ids=[f"{m._meta.model_name}.{a}" for m, a in ACTIONS]
)
def test_each_admin_action_writes_a_ledger_event_by_the_staff_user(
    model: type[models.Model],
    action: str,
    broker: Broker,
    make_key: Callable[..., CreatedApiKey],
    client: Client,
) -> None:
    world = sample_cycle(broker, today=timezone.localdate())
    key = f"{model._meta.model_name}.{action}"
    ACTION_SETUP.get(key, lambda world: None)(world)
    make_key("webhook_callback")
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    client.force_login(user)
    last_event = LedgerEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0

    response = client.post(
        reverse(f"admin:integrations_{model._meta.model_name}_changelist"),
        {
            "action": action,
            "_selected_action": list(model._default_manager.values_list("pk", flat=True)),
            "post": "yes",  # past Django's delete confirmation page
            **ACTION_INPUT.get(key, {}),
        },
    )
    assert response.status_code in (200, 302), response.status_code
    if (
        not response.streaming
        and response.status_code == 200
        and "<form" in response.content.decode()
    ):
        assert key in ACTION_INPUT, f"{key} asks for input: say what in ACTION_INPUT"

    assert LedgerEvent.objects.filter(id__gt=last_event, actor="staff:alice").exists(), (
        f"{model.__name__} action {action!r} wrote no ledger event"
    )


# -- the service's machinery (superusers only): lockouts and jobs ---------------------------


def _job(status: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args) "
            "VALUES ('alerts', 'integrations.tasks.evaluate_alerts', %s, '{}') RETURNING id",
            [status],
        )
        return int(cursor.fetchone()[0])


def _attempt(username: str, *, expired: bool = False) -> AccessAttempt:
    attempt = AccessAttempt.objects.create(
        username=username, ip_address="203.0.113.9", failures_since_start=5
    )
    if expired:  # past axes' cool-off (AXES_COOLOFF_TIME): its clean-up removes it
        AccessAttempt.objects.filter(pk=attempt.pk).update(
            attempt_time=timezone.now() - dt.timedelta(days=30)
        )
    return attempt


@pytest.mark.parametrize(
    ("url", "action", "rows", "confirmed"),
    [
        ("/admin/procrastinate/procrastinatejob/", "cancel", lambda: [_job("todo")], False),
        ("/admin/procrastinate/procrastinatejob/", "retry", lambda: [_job("failed")], False),
        ("/admin/procrastinate/procrastinatejob/", "abort", lambda: [_job("todo")], False),
        ("/admin/axes/accessattempt/", "delete_selected", lambda: [_attempt("bob").pk], True),
        (
            "/admin/axes/accessattempt/",
            "cleanup_expired_attempts",
            lambda: [_attempt("bob", expired=True).pk],
            False,
        ),
    ],
)
def test_a_superusers_change_to_the_machinery_is_a_ledger_event_naming_them(
    broker: Broker, url: str, action: str, rows: Callable[[], list[int]], confirmed: bool
) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-r00t-123"))
    ids = rows()
    form = {"action": action, "index": 0, "_selected_action": ids}

    answer = client.post(url, {**form, **({"post": "yes"} if confirmed else {})})

    assert answer.status_code == 302
    event = LedgerEvent.objects.filter(kind=LedgerKind.MACHINERY_CHANGED).get()
    assert (event.actor, event.data["action"], event.data["ids"]) == (
        "staff:root",
        "delete" if confirmed else action,
        ids,
    )


def test_a_lockout_deleted_from_its_page_is_a_ledger_event(broker: Broker) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-r00t-123"))
    attempt = _attempt("bob")

    client.post(f"/admin/axes/accessattempt/{attempt.pk}/delete/", {"post": "yes"})

    assert not AccessAttempt.objects.exists()
    event = LedgerEvent.objects.get(kind=LedgerKind.MACHINERY_CHANGED)
    assert (event.subject, event.actor, event.data["ids"]) == (
        "axes.AccessAttempt",
        "staff:root",
        [attempt.pk],
    )
    # Asked, not confirmed: nothing changed, nothing recorded.
    other = _attempt("carol")
    client.post(
        "/admin/axes/accessattempt/", {"action": "delete_selected", "_selected_action": [other.pk]}
    )
    assert LedgerEvent.objects.filter(kind=LedgerKind.MACHINERY_CHANGED).count() == 1


def test_a_machinery_action_names_only_the_rows_it_changed(broker: Broker) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-r00t-123"))
    succeeded, failed = _job("succeeded"), _job("failed")
    fresh, expired = _attempt("bob"), _attempt("carol", expired=True)

    # A retry leaves a job that did not fail as it was: nothing of it to record.
    client.post(
        "/admin/procrastinate/procrastinatejob/",
        {"action": "retry", "index": 0, "_selected_action": [succeeded]},
    )
    assert not LedgerEvent.objects.filter(kind=LedgerKind.MACHINERY_CHANGED).exists()
    client.post(
        "/admin/procrastinate/procrastinatejob/",
        {"action": "retry", "index": 0, "_selected_action": [succeeded, failed]},
    )
    # The clean-up removes every expired attempt, whichever was selected.
    client.post(
        "/admin/axes/accessattempt/",
        {"action": "cleanup_expired_attempts", "index": 0, "_selected_action": [fresh.pk]},
    )

    assert AccessAttempt.objects.filter(pk=fresh.pk).exists()
    events = LedgerEvent.objects.filter(kind=LedgerKind.MACHINERY_CHANGED).order_by("id")
    assert [(e.data["action"], e.data["ids"]) for e in events] == [
        ("retry", [failed]),
        ("cleanup_expired_attempts", [expired.pk]),
    ]
