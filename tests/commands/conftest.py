"""Fixtures of the command tests."""

from __future__ import annotations

from typing import Any

import pytest

from integrations.services import consumers as consumer_services
from integrations.services.consumer_merge import Merged, staging_merge


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[Merged]:
    """What each consumer registration's merge did (numbered or not), in order."""
    seen: list[Merged] = []

    def watched(*args: Any, **kwargs: Any) -> Merged:
        merged = staging_merge(*args, **kwargs)
        seen.append(merged)
        return merged

    monkeypatch.setattr(consumer_services, "staging_merge", watched)
    return seen
