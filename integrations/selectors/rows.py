"""Model instances from hand-written SQL (the hot paths that skip the ORM's query)."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


def model_from_row(model: type[M], columns: dict[str, Any]) -> M:
    """An instance of ``model`` loaded from hand-written SQL, by ``Model.from_db``:
    ``columns`` by attname, as stored (no converters run). Fields left out are deferred:
    they load from the database when first read."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in columns]
    return model.from_db(connection.alias, names, [columns[name] for name in names])
