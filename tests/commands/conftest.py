"""Fixtures of the command tests."""

from __future__ import annotations

import pytest

from integrations.consumers.load import ConsumerLoad, Merged


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[Merged]:
    """What each consumer registration's merge did (rounds merged as read, or at the end),
    in order."""
    seen: list[Merged] = []
    finish = ConsumerLoad.finish

    def watched(load: ConsumerLoad) -> Merged:
        merged = finish(load)
        seen.append(merged)
        return merged

    monkeypatch.setattr(ConsumerLoad, "finish", watched)
    return seen
