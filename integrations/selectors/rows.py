"""Model instances from hand-written SQL (the hot paths that skip the ORM's query)."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model, signals
from django.db.models.base import ModelState

M = TypeVar("M", bound=Model)


def model_from_row(model: type[M], columns: dict[str, Any]) -> M:
    """An instance of ``model`` loaded from hand-written SQL: ``columns`` by attname, as
    stored (no converters run). Fields left out load from the database when first read.

    What ``Model.from_db`` does, without running ``__init__`` over every field of the model
    to mark the missing ones deferred (docs/benchmarks.md, callbacks): a field is
    deferred when its attname is not in the instance's ``__dict__``. Models with
    ``pre_init``/``post_init`` receivers go through ``from_db``, signals and all."""
    if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
        names = [f.attname for f in model._meta.concrete_fields if f.attname in columns]
        return model.from_db(connection.alias, names, [columns[name] for name in names])
    instance = model.__new__(model)
    instance._state = ModelState()
    instance._state.adding = False
    instance._state.db = connection.alias
    instance.__dict__.update(columns)
    return instance
