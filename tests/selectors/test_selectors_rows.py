"""``model_from_row``: instances built from hand-written SQL, by ``Model.from_db``."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import signals

from integrations.models import Broker
from integrations.selectors.rows import model_from_row
from integrations.services.staff.brokers import broker_create

pytestmark = pytest.mark.django_db


def test_fields_left_out_load_when_first_read() -> None:
    stored = broker_create(broker_id="4821", name="Acme Data", actor="test")
    broker = model_from_row(Broker, {"id": stored.pk, "broker_id": "4821"})
    assert broker._state.adding is False
    assert broker.get_deferred_fields() >= {"name", "mode"}
    assert broker.name == "Acme Data"  # loaded now
    assert broker == stored


def test_models_with_init_receivers_are_built_through_from_db() -> None:
    stored = broker_create(broker_id="4821", name="Acme Data", actor="test")
    seen: list[Any] = []

    def receiver(sender: type, instance: Broker, **kwargs: Any) -> None:
        seen.append(instance)

    signals.post_init.connect(receiver, sender=Broker)
    try:
        broker = model_from_row(Broker, {"id": stored.pk, "broker_id": "4821"})
    finally:
        signals.post_init.disconnect(receiver, sender=Broker)
    assert seen == [broker]
    assert broker.name == "Acme Data"
