"""Fixtures of the command tests."""

from __future__ import annotations

import pytest

from integrations.consumers.load import ConsumerLoad, Merged
from integrations.services import consumers as consumer_services


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[Merged]:
    """What each consumer registration's merge did (rounds merged as read, or at the end),
    in order."""
    seen: list[Merged] = []
    merge = consumer_services._merge

    def watched(load: ConsumerLoad) -> Merged:
        merged = merge(load)
        seen.append(merged)
        return merged

    monkeypatch.setattr(consumer_services, "_merge", watched)
    return seen
