"""Model instances from hand-written SQL (the hot paths that skip the ORM's query)."""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Model
from django.db.models.base import DEFERRED

M = TypeVar("M", bound=Model)


def model_from_row(model: type[M], columns: dict[str, Any]) -> M:
    """An instance of ``model`` loaded from hand-written SQL, by ``Model.from_db``:
    ``columns`` by attname, as stored (no converters run). Fields left out are deferred:
    they load from the database when first read."""
    # A value for every concrete field, DEFERRED where left out: what from_db builds itself
    # when given fewer, there by a search of the given names for each field.
    names = _attnames(model)
    values = [columns.get(name, DEFERRED) for name in names]
    return model.from_db(DEFAULT_DB_ALIAS, names, values)  # the alias of django.db.connection


@cache
def _attnames(model: type[Model]) -> tuple[str, ...]:
    return tuple(field.attname for field in model._meta.concrete_fields)
