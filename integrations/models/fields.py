"""Model fields of our own."""

from __future__ import annotations

from typing import Any

from django.db import models

from integrations import encryption
from integrations.ledger_kinds import LedgerKind

# Who did something, as the ledger names them ("staff:<username>", "cli:<OS user>",
# "apikey:<prefix>"): a username alone may hold 150 characters, so every column naming an
# actor is as wide as the ledger's own.
ACTOR_MAX_LENGTH = 200


class EncryptedTextField(models.TextField):
    """A text value stored as a Fernet token; Python code only ever sees the clear text.

    Every model that holds one is re-encrypted by ``manage.py secrets reencrypt``.
    """

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        if value is None or value == "":
            return value
        return encryption.decrypt(value)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if value is None or value == "":
            return value
        return encryption.encrypt(value)


class LedgerKindField(models.CharField):
    """A ledger event's kind: the registry's members (``LedgerKind``) as choices, so a form or
    the admin offers only a known kind (``services.ledger`` refuses any other), kept out of
    migrations: the choices are the registry's, so a new kind needs no migration."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["choices"] = [(kind.value, kind.value) for kind in LedgerKind]
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("choices", None)
        return name, path, args, kwargs
