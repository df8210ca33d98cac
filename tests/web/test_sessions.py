"""The session engine: each session's row names its signed-in user, so ending one member's
sessions reads theirs alone, however many anonymous sessions there are."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.contrib.sessions.backends.base import SessionBase, UpdateError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from integrations.models import AdminSession
from integrations.services.staff.staff_mfa import staff_sessions_end
from integrations.services.staff.staff_sign_in import staff_user_deactivate
from integrations.tasks import purge_expired_sessions
from integrations.web.sessions import SessionStore

pytestmark = pytest.mark.django_db

PASSWORD = "pw-alice-123-long"


def test_a_session_row_names_whoever_is_signed_in() -> None:
    alice = User.objects.create_superuser("alice", "alice@example.com", PASSWORD)
    client = Client()
    client.post(reverse("admin:login"), {"username": "alice", "password": PASSWORD})
    (session,) = AdminSession.objects.all()
    assert session.user_id == alice.pk

    client.post(reverse("admin:logout"))
    assert not AdminSession.objects.filter(user_id=alice.pk).exists()


@pytest.mark.django_db(transaction=True)  # saved on asgiref's thread, its own connection
def test_a_session_saved_from_async_code_names_its_user_too() -> None:
    alice = User.objects.create_user("alice", is_staff=True)
    session = SessionStore()
    session["_auth_user_id"] = str(alice.pk)

    asyncio.run(sync_to_async(_its_connection_closed)())
    try:
        asyncio.run(session.asave())
    finally:
        asyncio.run(sync_to_async(_its_connection_closed)())

    assert AdminSession.objects.get(session_key=session.session_key).user_id == alice.pk


def test_a_session_saved_again_is_one_update_in_no_transaction_of_its_own() -> None:
    # Saved on every staff request: a transaction around it was two more round trips each.
    alice = User.objects.create_user("alice", is_staff=True)
    session = _opened_again(alice)
    session["seen"] = 1

    with CaptureQueriesContext(connection) as saved:
        session.save()

    assert [q["sql"].split(" ", 1)[0] for q in saved.captured_queries] == ["UPDATE"]
    row = AdminSession.objects.get(session_key=session.session_key)
    assert (row.user_id, SessionStore(row.session_key).load()["seen"]) == (alice.pk, 1)

    # Its row gone (the member's sessions ended meanwhile): over, as in Django's engine, and
    # the request's transaction, if any, still usable.
    AdminSession.objects.all().delete()
    session["seen"] = 2
    with pytest.raises(UpdateError):
        session.save()
    assert not AdminSession.objects.exists()


@pytest.mark.django_db(transaction=True)  # saved on asgiref's thread, its own connection
def test_a_session_saved_again_from_async_code_is_the_same_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alice = User.objects.create_user("alice", is_staff=True)
    session = _opened_again(alice)
    session["seen"] = 1
    saves: list[bool] = []
    sync_save = SessionStore.save

    def save(self: SessionStore, must_create: bool = False) -> None:
        saves.append(must_create)
        sync_save(self, must_create)

    monkeypatch.setattr(SessionStore, "save", save)

    try:
        asyncio.run(session.asave())
    finally:
        asyncio.run(sync_to_async(_its_connection_closed)())

    assert saves == [False]
    assert SessionStore(session.session_key).load()["seen"] == 1


def _opened_again(user: User) -> SessionStore:
    """``user``'s session, saved, then read as the next request reads it."""
    created = SessionStore()
    created["_auth_user_id"] = str(user.pk)
    created.create()
    return SessionStore(created.session_key)


def _its_connection_closed() -> None:
    connection.close()  # the connection of the thread this runs on


def test_ending_a_members_sessions_decodes_no_session(monkeypatch: Any) -> None:
    alice = User.objects.create_user("alice", is_staff=True)
    bob = User.objects.create_user("bob", is_staff=True)
    for signed_in in (alice, alice, bob, None, None):
        session = SessionStore()
        if signed_in is not None:
            session["_auth_user_id"] = str(signed_in.pk)
        else:
            session["dropportal_oidc_next"] = "/admin/"  # a sign-in started, anonymous
        session.create()
    kept = AdminSession.objects.filter(user_id=alice.pk).first()
    assert kept is not None

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a session was decoded: every one would be, one by one")

    monkeypatch.setattr(SessionBase, "decode", never)
    assert staff_sessions_end(alice, keep_session_key=kept.session_key) == 1
    assert staff_user_deactivate(user=alice, actor="test") == 1
    assert list(AdminSession.objects.filter(user_id=alice.pk)) == []
    assert AdminSession.objects.filter(user_id=bob.pk).count() == 1
    assert AdminSession.objects.filter(user_id=None).count() == 2


def test_the_migration_moves_open_sessions_with_their_user() -> None:
    import importlib
    from pathlib import Path

    from django.apps import apps as django_apps
    from django.conf import settings
    from django.contrib.sessions.backends.db import SessionStore as DjangoSessionStore
    from django.contrib.sessions.models import Session

    alice = User.objects.create_user("alice", is_staff=True)
    signed_in, anonymous = DjangoSessionStore(), DjangoSessionStore()
    signed_in["_auth_user_id"] = str(alice.pk)
    anonymous["dropportal_oidc_next"] = "/admin/"
    signed_in.create()
    anonymous.create()
    Session.objects.create(
        session_key="x" * 32, session_data="", expire_date=timezone.now() - dt.timedelta(hours=1)
    )
    (path,) = (Path(settings.BASE_DIR) / "integrations" / "migrations").glob(
        "*_admin_sessions_by_user.py"
    )
    migration = importlib.import_module(f"integrations.migrations.{path.stem}")
    migration.sessions_moved_in(django_apps, None)

    assert not Session.objects.exists()
    moved = dict(AdminSession.objects.values_list("session_key", "user_id"))
    assert moved == {signed_in.session_key: alice.pk, anonymous.session_key: None}
    assert SessionStore(signed_in.session_key).load()["_auth_user_id"] == str(alice.pk)


def test_the_nightly_purge_deletes_expired_sessions_only() -> None:
    for _ in range(3):
        SessionStore().create()
    expired = AdminSession.objects.all()[:2]
    AdminSession.objects.filter(pk__in=[s.pk for s in expired]).update(
        expire_date=timezone.now() - dt.timedelta(seconds=1)
    )
    assert purge_expired_sessions() == 2
    assert AdminSession.objects.count() == 1
    assert purge_expired_sessions() == 0
