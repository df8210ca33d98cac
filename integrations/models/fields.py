"""Model fields shared by several models."""

from __future__ import annotations

from typing import Any

from django.db import models

from integrations import encryption


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
