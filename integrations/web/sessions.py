"""The session engine: Django's database sessions, kept in ``AdminSession`` with the
signed-in user's id beside the signed data, so one member's sessions are found by an index::

    SESSION_ENGINE = "integrations.web.sessions"
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore

from integrations.models import AdminSession


class SessionStore(DatabaseSessionStore):
    @classmethod
    def get_model_class(cls) -> type[AdminSession]:
        return AdminSession

    def create_model_instance(self, data: dict[str, Any]) -> AdminSession:
        return _with_its_user(cast(AdminSession, super().create_model_instance(data)), data)

    async def acreate_model_instance(self, data: dict[str, Any]) -> AdminSession:
        session = cast(AdminSession, await super().acreate_model_instance(data))
        return _with_its_user(session, data)


def _with_its_user(session: AdminSession, data: dict[str, Any]) -> AdminSession:
    user_id = str(data.get(SESSION_KEY) or "")  # what login() keeps: the pk as text
    session.user_id = int(user_id) if user_id.isdigit() else None  # None: anonymous
    return session
