"""Shared fixtures: a broker, API keys, and an API client that sends a bearer key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from integrations.models import Broker
from integrations.services.brokers import broker_create
from integrations.services.keys import CreatedApiKey, api_key_create


@pytest.fixture
def broker(db: None) -> Broker:
    return broker_create(broker_id="4821", name="Acme Data", mode="test", actor="test")


@pytest.fixture
def make_key(broker: Broker) -> Callable[..., CreatedApiKey]:
    def make(*scopes: str, for_broker: Broker | None = None) -> CreatedApiKey:
        return api_key_create(
            broker=for_broker or broker, scopes=list(scopes) or ["ingest"], actor="test"
        )

    return make


@pytest.fixture
def api_client() -> APIClient:
    return APIClient()


def bearer(key: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture(autouse=True)
def drop_packages_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: Any) -> None:
    """Packages downloaded by a test's `drop pull` go to a temporary folder, not var/."""
    from integrations.services import drop

    monkeypatch.setattr(drop, "PACKAGES_DIR", tmp_path_factory.mktemp("drop-packages"))
