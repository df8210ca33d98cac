"""The admin's sessions (Django's database sessions), each row naming its signed-in user.

Django's own table keeps a session's user only inside its signed data: ending one member's
sessions (a deactivation, a reset, a password change) had to decode every unexpired session,
and anonymous ones (each sign-in started at the identity provider keeps one) have no bound.
``user_id`` is written from the session's data at each save (``integrations/web/sessions.py``,
Django's documented way to extend the database engine), so ending them is one indexed query.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.sessions.base_session import AbstractBaseSession
from django.db import models


class AdminSession(AbstractBaseSession):
    # No foreign key: a session saved as its user is deleted must not fail the request; a
    # deleted user's session signs nobody in anyway.
    user_id = models.IntegerField(null=True, db_index=True)

    class Meta(AbstractBaseSession.Meta):
        verbose_name = "admin session"
        verbose_name_plural = "admin sessions"

    @classmethod
    def get_session_store_class(cls) -> Any:
        # By name: the engine sits above the models (it imports this one).
        return import_module(settings.SESSION_ENGINE).SessionStore
