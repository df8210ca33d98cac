"""Staff accounts and roles changed in the admin are ledger events by the staff user."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from integrations.models import LedgerEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-9x-a"))
    return client


def test_granting_a_role_is_in_the_ledger_without_the_password(alice: Client) -> None:
    password = "Tr1cky-Passphrase-42"
    response = alice.post(
        "/admin/auth/user/add/",
        {
            "username": "ada",
            "password1": password,
            "password2": password,
            "usable_password": "true",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    ada = User.objects.get(username="ada")
    auditors = Group.objects.get(name="Auditors")
    response = alice.post(
        f"/admin/auth/user/{ada.pk}/change/",
        {
            "username": "ada",
            "is_active": "on",
            "is_staff": "on",
            "groups": [auditors.pk],
            "date_joined_0": "2026-11-01",
            "date_joined_1": "10:00:00",
            "initial-date_joined_0": "2026-11-01",
            "initial-date_joined_1": "10:00:00",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]

    added, changed = LedgerEvent.objects.filter(kind__startswith="staff_user.").order_by("id")
    assert (added.kind, added.subject, added.actor) == ("staff_user.added", "ada", "staff:alice")
    assert changed.kind == "staff_user.changed"
    assert {"Groups", "Staff status"} <= set(changed.data["fields"])  # as the form labels them
    assert changed.data["groups"] == ["Auditors"]
    assert changed.data["is_staff"] is True
    every_event = " ".join(str(e.data) for e in LedgerEvent.objects.all())
    assert password not in every_event and ada.password not in every_event


def test_no_permission_is_granted_to_one_account_beside_its_roles(alice: Client) -> None:
    ada = User.objects.create_user("ada", password="pw-ada-123-x", is_staff=True)
    export = Permission.objects.get(codename="export_audit_records")

    assert b"user_permissions" not in alice.get(f"/admin/auth/user/{ada.pk}/change/").content
    response = alice.post(
        f"/admin/auth/user/{ada.pk}/change/",
        {
            "username": "ada",
            "is_active": "on",
            "is_staff": "on",
            "user_permissions": [export.pk],  # a crafted form: not a field of the page
            "date_joined_0": "2026-11-01",
            "date_joined_1": "10:00:00",
            "initial-date_joined_0": "2026-11-01",
            "initial-date_joined_1": "10:00:00",
        },
    )

    assert response.status_code == 302, response.content.decode()[:3000]
    assert not ada.user_permissions.exists()


def test_changing_a_password_and_deleting_a_user_are_events(alice: Client) -> None:
    bob = User.objects.create_user("bob", password="old-pw-123-x")
    response = alice.post(
        f"/admin/auth/user/{bob.pk}/password/",
        {"password1": "New-pw-456-y!", "password2": "New-pw-456-y!", "usable_password": "true"},
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    alice.post(f"/admin/auth/user/{bob.pk}/delete/", {"post": "yes"})
    assert not User.objects.filter(username="bob").exists()
    kinds = list(
        LedgerEvent.objects.filter(subject="bob").order_by("id").values_list("kind", flat=True)
    )
    # Django's own change (the field) and the reset, whose sessions it ended.
    assert kinds == ["staff_user.changed", "staff_user.password_reset", "staff_user.deleted"]


def test_a_group_change_lists_its_permissions(alice: Client) -> None:
    group = Group.objects.get(name="Operators")
    alice.post(f"/admin/auth/group/{group.pk}/change/", {"name": "Operators", "permissions": []})
    event = LedgerEvent.objects.get(kind="group.changed")
    assert event.subject == "Operators"
    assert event.data["fields"] == ["Permissions"]
    assert event.data["permissions"] == []


def _bob_saved(alice: Client, bob: User, *, active: bool, staff: bool = True) -> None:
    response = alice.post(
        f"/admin/auth/user/{bob.pk}/change/",
        {
            "username": "bob",
            **({"is_active": "on"} if active else {}),
            **({"is_staff": "on"} if staff else {}),
            "date_joined_0": "2026-11-01",
            "date_joined_1": "10:00:00",
            "initial-date_joined_0": "2026-11-01",
            "initial-date_joined_1": "10:00:00",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]


def test_deactivating_in_the_admin_ends_every_session_as_the_command_does(
    alice: Client,
) -> None:
    # Unticking Active alone left the sessions in place: a reactivation revived them,
    # a stolen one included, already past the second factor.
    bob = User.objects.create_user("bob", password="pw-bob-123-long", is_staff=True)
    bobs = Client()
    bobs.force_login(bob)
    assert bobs.get("/admin/").status_code == 200

    _bob_saved(alice, bob, active=False)
    _bob_saved(alice, bob, active=True)

    assert bobs.get("/admin/").status_code == 302, "the session ended with the deactivation"
    (event,) = LedgerEvent.objects.filter(kind="staff_user.deactivated")
    assert (event.subject, event.actor, event.data) == ("bob", "staff:alice", {"sessions_ended": 1})
    changed = LedgerEvent.objects.filter(kind="staff_user.changed", subject="bob").order_by("id")
    assert [e.data["is_active"] for e in changed] == [False, True]
    assert alice.get("/admin/").status_code == 200, "the superuser's own session stays"


def test_taking_the_staff_status_away_ends_every_session_too(alice: Client) -> None:
    # As with Active: giving it back would otherwise revive them.
    bob = User.objects.create_user("bob", password="pw-bob-123-long", is_staff=True)
    bobs = Client()
    bobs.force_login(bob)
    assert bobs.get("/admin/").status_code == 200

    _bob_saved(alice, bob, active=True, staff=False)
    _bob_saved(alice, bob, active=True, staff=True)

    assert bobs.get("/admin/").status_code == 302, "the session ended with the staff status"
    changed = LedgerEvent.objects.filter(kind="staff_user.changed", subject="bob").order_by("id")
    assert [e.data["is_staff"] for e in changed] == [False, True]
