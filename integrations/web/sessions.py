"""The session engine: Django's database sessions, kept in ``AdminSession`` with the
signed-in user's id beside the signed data, so one member's sessions are found by an index::

    SESSION_ENGINE = "integrations.web.sessions"
"""

from __future__ import annotations

from typing import Any, cast

from asgiref.sync import sync_to_async
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends.base import UpdateError
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.db import DatabaseError, router

from integrations.models import AdminSession


class SessionStore(DatabaseSessionStore):
    @classmethod
    def get_model_class(cls) -> type[AdminSession]:
        return AdminSession

    def save(self, must_create: bool = False) -> None:
        """As Django's, but a saved session's UPDATE is sent alone, not in a transaction.

        Staff sessions are saved on every request (their idle expiry): Django's
        ``transaction.atomic`` cost each request two more round trips (BEGIN and COMMIT, or a
        savepoint inside a transaction) around one statement, atomic by itself, that breaks no
        constraint (the row's key does not change; ``user_id`` has no foreign key). A row gone
        is a count of 0, not an error, so an enclosing transaction stays usable. A new session
        (``must_create``) is still inserted Django's way: a key already taken is an
        ``IntegrityError``, which its savepoint keeps from ending an enclosing transaction.
        """
        if must_create or self.session_key is None:
            return super().save(must_create)
        obj = self.create_model_instance(self._get_session())  # type: ignore[attr-defined]
        fields = {
            field.attname: getattr(obj, field.attname)
            for field in obj._meta.concrete_fields
            if not field.primary_key
        }
        using = router.db_for_write(self.model, instance=obj)
        try:
            updated = self.model._default_manager.using(using).filter(pk=obj.pk).update(**fields)
        except DatabaseError as exc:
            raise UpdateError from exc  # as Django's engine
        if not updated:
            # As Django's: the row is gone (the member's sessions ended): the session is over.
            raise UpdateError
        return None

    async def asave(self, must_create: bool = False) -> None:
        """``save``'s one UPDATE from async code too (one rule for both ways)."""
        if must_create or self.session_key is None:
            return await super().asave(must_create)
        return await sync_to_async(self.save)(must_create)

    def create_model_instance(self, data: dict[str, Any]) -> AdminSession:
        return _with_its_user(cast(AdminSession, super().create_model_instance(data)), data)

    async def acreate_model_instance(self, data: dict[str, Any]) -> AdminSession:
        session = cast(AdminSession, await super().acreate_model_instance(data))
        return _with_its_user(session, data)


def _with_its_user(session: AdminSession, data: dict[str, Any]) -> AdminSession:
    user_id = str(data.get(SESSION_KEY) or "")  # what login() keeps: the pk as text
    session.user_id = int(user_id) if user_id.isdigit() else None  # None: anonymous
    return session
