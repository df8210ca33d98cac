"""A page submitted twice at once (a double click, two members of staff): both pass the
form's checks before either commits, one is saved and the other is told why, never a 500
nor a success it did not have; the ledger holds one event."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Group, User
from django.db import connections
from django.test import Client
from django.urls import reverse

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, Canary, Consumer, LedgerEvent, ServiceProvider
from integrations.services.cycle.canaries import canary_add
from tests.builders import ConsumerFactory, DirectiveFactory
from tests.conftest import database_url, sessions_waiting_for_locks

# Two threads and a second connection see the rows.
pytestmark = pytest.mark.django_db(transaction=True)


def _submitted_together(url: str, form: dict[str, Any]) -> list[tuple[int, str, str]]:
    """POST ``form`` to ``url`` from two sessions at once; each answer's status, where it
    leads and the messages of the page it leads to."""
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    members = [Client(raise_request_exception=False) for _ in range(2)]
    for member in members:
        member.force_login(user)
    answers: list[tuple[Client, int, str]] = []

    def submit(member: Client) -> None:
        try:
            answer = member.post(url, form)
            answers.append((member, answer.status_code, answer.get("Location", "")))
        finally:
            connections.close_all()

    # Another transaction holds the ledger: each submit passed the form's checks and wrote
    # its row when it waits there, or waits for the other's row (the same name).
    holder = psycopg.connect(database_url())
    try:
        holder.execute("LOCK TABLE integrations_ledgerevent IN SHARE ROW EXCLUSIVE MODE")
        threads = [threading.Thread(target=submit, args=(member,)) for member in members]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() + sum(not t.is_alive() for t in threads) < 2:
            assert time.monotonic() < deadline, "the two submits neither waited nor ended"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)
    # The page each was led to, with the messages left for that session.
    return [
        (status, location, member.get(location).content.decode() if location else "")
        for member, status, location in answers
    ]


def test_a_provider_added_twice_at_once_is_added_once(broker: Broker) -> None:
    url = reverse("admin:integrations_serviceprovider_add")

    answers = _submitted_together(
        url, {"broker": broker.pk, "name": "Mailhouse", "contact": "", "s3_prefix": ""}
    )

    assert sorted(status for status, _, _ in answers) == [302, 302]  # no 500
    (again,) = (page for _, location, page in answers if location == url)
    assert "already has a provider named &#x27;Mailhouse&#x27;" in again
    assert ServiceProvider.objects.count() == 1
    assert LedgerEvent.objects.filter(kind=LedgerKind.SERVICE_PROVIDER_ADDED).count() == 1


def test_a_broker_added_twice_at_once_is_added_once(db: None) -> None:
    url = reverse("admin:integrations_broker_add")
    form = {
        "broker_id": "4821",
        "name": "Acme Data",
        "mode": "test",
        "drop_base_url": "",
        "pull_interval_days": "30",
        "lists_selected": ["email"],
        "lists_selected_reason": "The broker holds email addresses only.",
    }

    answers = _submitted_together(url, form)

    assert sorted(status for status, _, _ in answers) == [302, 302]  # no 500
    (again,) = (page for _, location, page in answers if location == url)
    assert "broker 4821 is already registered" in again
    assert Broker.objects.count() == 1
    assert LedgerEvent.objects.filter(kind=LedgerKind.BROKER_CREATED).count() == 1
    # The other's list selection went with it: one, the saved broker's.
    assert LedgerEvent.objects.filter(kind=LedgerKind.BROKER_LISTS_SELECTED).count() == 1


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_an_acknowledgement_submitted_twice_at_once_is_recorded_once_and_said_so() -> None:
    directive = DirectiveFactory.create()
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    changelist = reverse("admin:integrations_directive_changelist")
    references = ("ticket 4410", "letter of May 2")
    members = {reference: Client(raise_request_exception=False) for reference in references}
    for member in members.values():
        member.force_login(user)
    answers: dict[str, list[str]] = {}

    def submit(reference: str) -> None:
        try:
            answer = members[reference].post(
                changelist,
                {
                    "action": "acknowledge_directives",
                    "_selected_action": [directive.pk],
                    "apply": "1",
                    "reference": reference,
                },
            )
            answers[reference] = [str(answer.status_code)]
        finally:
            connections.close_all()

    # Another transaction holds the directive: both submits see it unacknowledged, then wait.
    holder = psycopg.connect(database_url())
    try:
        holder.execute(
            "SELECT 1 FROM integrations_directive WHERE id = %s FOR UPDATE", [directive.pk]
        )
        threads = [threading.Thread(target=submit, args=(r,)) for r in references]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() + sum(not t.is_alive() for t in threads) < 2:
            assert time.monotonic() < deadline, "the two submits neither waited nor ended"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)
    assert answers == {reference: ["302"] for reference in references}
    # The list each was led back to, with the messages left for that session.
    for reference, member in members.items():
        answers[reference] = [str(m) for m in member.get(changelist).context["messages"]]

    directive.refresh_from_db()
    kept = directive.acknowledgement_reference
    (other,) = (reference for reference in references if reference != kept)
    assert answers[kept] == ["Recorded 1 acknowledgement(s)."]
    (told,) = answers[other]
    assert f"directive {directive.pk} was already acknowledged" in told
    assert f"({kept!r})" in told
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_ACKNOWLEDGED).count() == 1


def test_a_role_group_added_twice_at_once_is_added_once(db: None) -> None:
    url = reverse("admin:auth_group_add")

    answers = _submitted_together(url, {"name": "Readers"})

    assert sorted(status for status, _, _ in answers) == [302, 302]  # no 500
    (again,) = (page for _, location, page in answers if location == url)
    assert "Readers" in again and "already" in again
    assert Group.objects.filter(name="Readers").count() == 1
    assert LedgerEvent.objects.filter(kind=LedgerKind.GROUP_ADDED).count() == 1


def test_a_staff_account_added_twice_at_once_is_added_once(db: None) -> None:
    url = reverse("admin:auth_user_add")
    form = {"username": "bob", "password1": "pw-b0b-long-1", "password2": "pw-b0b-long-1"}

    answers = _submitted_together(url, form)

    assert sorted(status for status, _, _ in answers) == [302, 302]  # no 500
    (again,) = (page for _, location, page in answers if location == url)
    assert "bob" in again and "already" in again
    assert User.objects.filter(username="bob").count() == 1


def test_a_canary_named_twice_at_once_is_named_once(broker: Broker) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-CANARY")
    url = reverse("admin:integrations_canary_add")

    answers = _submitted_together(url, {"broker": broker.pk, "remote_identifier": "C-CANARY"})

    assert sorted(status for status, _, _ in answers) == [302, 302]  # no 500
    (again,) = (page for _, location, page in answers if location == url)
    assert "is a canary of broker 4821 already" in again
    assert Canary.objects.count() == 1
    assert LedgerEvent.objects.filter(kind=LedgerKind.CANARY_ADDED).count() == 1


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.parametrize("page", ["delete", "delete_selected"])
def test_a_canary_removed_twice_at_once_is_removed_once(broker: Broker, page: str) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-CANARY")
    canary = canary_add(broker=broker, remote_identifier="C-CANARY", actor="test")
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    members = [Client(raise_request_exception=False) for _ in range(2)]
    for member in members:
        member.force_login(user)
    form: dict[str, Any]
    if page == "delete":  # the record's own delete page, confirmed
        url, form = reverse("admin:integrations_canary_delete", args=[canary.pk]), {"post": "yes"}
    else:  # the list's action, confirmed
        url = reverse("admin:integrations_canary_changelist")
        form = {"action": "delete_selected", "post": "yes", "_selected_action": [canary.pk]}
    statuses: list[int] = []

    def submit(member: Client) -> None:
        try:
            statuses.append(member.post(url, form).status_code)
        finally:
            connections.close_all()

    # Another transaction holds the canary: both submits found it, then wait for its row.
    holder = psycopg.connect(database_url())
    try:
        holder.execute("SELECT 1 FROM integrations_canary WHERE id = %s FOR UPDATE", [canary.pk])
        threads = [threading.Thread(target=submit, args=(member,)) for member in members]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() + sum(not t.is_alive() for t in threads) < 2:
            assert time.monotonic() < deadline, "the two submits neither waited nor ended"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)

    assert statuses == [302, 302]  # no 500
    assert not Canary.objects.exists()
    assert LedgerEvent.objects.filter(kind=LedgerKind.CANARY_REMOVED).count() == 1
    # Each was led back to the list: the messages left for its session.
    changelist = reverse("admin:integrations_canary_changelist")
    told = " ".join(
        str(m) for member in members for m in member.get(changelist).context["messages"]
    )
    assert "is not a canary of broker 4821" in told


@pytest.mark.parametrize("page", ["delete", "delete_selected"])
def test_a_role_group_deleted_twice_at_once_is_one_deletion_in_the_ledger(page: str) -> None:
    group = Group.objects.create(name="Readers")
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    members = [Client(raise_request_exception=False) for _ in range(2)]
    for member in members:
        member.force_login(user)
    form: dict[str, Any]
    if page == "delete":  # the group's own delete page, confirmed
        url, form = reverse("admin:auth_group_delete", args=[group.pk]), {"post": "yes"}
    else:  # the list's action, confirmed
        url = reverse("admin:auth_group_changelist")
        form = {"action": "delete_selected", "post": "yes", "_selected_action": [group.pk]}
    statuses: list[int] = []

    def submit(member: Client) -> None:
        try:
            statuses.append(member.post(url, form).status_code)
        finally:
            connections.close_all()

    # Another transaction holds the group: both submits found it, then wait for its row.
    holder = psycopg.connect(database_url())
    try:
        holder.execute("SELECT 1 FROM auth_group WHERE id = %s FOR UPDATE", [group.pk])
        threads = [threading.Thread(target=submit, args=(member,)) for member in members]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() + sum(not t.is_alive() for t in threads) < 2:
            assert time.monotonic() < deadline, "the two submits neither waited nor ended"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)

    assert statuses == [302, 302]
    assert not Group.objects.filter(name="Readers").exists()
    # One deletion, one event: the other submit found it gone and recorded nothing.
    assert LedgerEvent.objects.filter(kind=LedgerKind.GROUP_DELETED).count() == 1


def _held_while_posted(
    url: str, form: dict[str, Any], held: str, params: list[Any]
) -> tuple[list[int], list[Client]]:
    """POST ``form`` to ``url`` from two sessions of one superuser while another transaction
    runs ``held`` (a row lock both submits reach after their page found the row), then let
    them go: the statuses and the two sessions."""
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    members = [Client(raise_request_exception=False) for _ in range(2)]
    for member in members:
        member.force_login(user)
    statuses: list[int] = []

    def submit(member: Client) -> None:
        try:
            statuses.append(member.post(url, form).status_code)
        finally:
            connections.close_all()

    holder = psycopg.connect(database_url())
    try:
        holder.execute(held, params)
        threads = [threading.Thread(target=submit, args=(member,)) for member in members]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() + sum(not t.is_alive() for t in threads) < 2:
            assert time.monotonic() < deadline, "the two submits neither waited nor ended"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)
    return statuses, members


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.parametrize("page", ["delete", "delete_selected"])
def test_a_consumer_forgotten_twice_at_once_is_forgotten_once(broker: Broker, page: str) -> None:
    consumer = ConsumerFactory.create(broker=broker, remote_identifier="C-1")
    changelist = reverse("admin:integrations_consumer_changelist")
    form: dict[str, Any]
    if page == "delete":
        url = reverse("admin:integrations_consumer_delete", args=[consumer.pk])
        form = {"post": "yes"}
    else:
        url = changelist
        form = {"action": "delete_selected", "post": "yes", "_selected_action": [consumer.pk]}

    statuses, members = _held_while_posted(
        url, form, "SELECT 1 FROM integrations_consumer WHERE id = %s FOR UPDATE", [consumer.pk]
    )

    assert statuses == [302, 302]  # no 500
    assert not Consumer.objects.exists()
    assert LedgerEvent.objects.filter(kind=LedgerKind.CONSUMER_FORGOTTEN).count() == 1
    told = " ".join(
        str(m) for member in members for m in member.get(changelist).context["messages"]
    )
    assert "broker 4821 has no consumer 'C-1'" in told
