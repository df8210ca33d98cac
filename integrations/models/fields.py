"""Model fields of our own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.db import models
from django.db.models.constants import LOOKUP_SEP
from django.db.models.sql.query import Query

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


_M = TypeVar("_M", bound=models.Model)


def encrypted_columns_deferred(
    model: type[models.Model], related: Iterable[str] | Mapping[str, Any] | bool = ()
) -> list[str]:
    """``defer()``'s arguments for every ``EncryptedTextField`` of ``model`` and of each row
    read with it: ``related`` is ``select_related``'s paths (``"cycle__broker"``), or its
    tree as a query holds it (``query.select_related``: a dict, or True for every foreign
    key that is not null). A page that shows none of them so reads, and decrypts, none
    (``encrypted_columns_unread``, for a queryset).
    """
    if isinstance(related, bool):
        # As deep as ``select_related()`` with no path follows foreign keys.
        tree = _required_relations(model, Query.max_depth) if related else {}
    elif isinstance(related, Mapping):
        tree = dict(related)
    else:
        tree = {}
        for path in related:
            node = tree
            for name in path.split(LOOKUP_SEP):
                node = node.setdefault(name, {})
    return list(_deferred(model, tree, ""))


def encrypted_columns_unread(rows: models.QuerySet[_M]) -> models.QuerySet[_M]:
    """``rows`` read without any encrypted column, of theirs or of the rows read with them
    (its ``select_related``): what the admin's lists and their filters' choices read."""
    unread = encrypted_columns_deferred(rows.model, rows.query.select_related)
    return rows.defer(*unread) if unread else rows


def _deferred(model: type[models.Model], tree: Mapping[str, Any], prefix: str) -> Iterable[str]:
    for field in model._meta.concrete_fields:
        if isinstance(field, EncryptedTextField):
            yield f"{prefix}{field.name}"
    for name, below in tree.items():
        related = model._meta.get_field(name).related_model
        if isinstance(related, type):  # a model, not "self" left unresolved
            yield from _deferred(related, below, f"{prefix}{name}{LOOKUP_SEP}")


def _required_relations(model: type[models.Model], depth: int) -> dict[str, Any]:
    # What ``select_related()`` follows: each foreign key that is not null, ``depth`` deep.
    if depth == 0:
        return {}
    return {
        field.name: _required_relations(field.related_model, depth - 1)
        for field in model._meta.concrete_fields
        if field.is_relation and not field.null and isinstance(field.related_model, type)
    }


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
