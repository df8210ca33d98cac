"""Fixtures of the command tests."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from integrations.consumers.load import ConsumerLoad, Merged
from tests.conftest import s3_reached_at


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


@pytest.fixture
def bucket(s3_server: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An empty bucket ``exports`` (the server is reset per test), reached the way a
    deployment reaches it: boto3's credential chain and DROPPORTAL_S3_ENDPOINT_URL."""
    s3_reached_at(s3_server, settings=settings, monkeypatch=monkeypatch)
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="exports")
    yield s3
    listed = s3.list_objects_v2(Bucket="exports").get("Contents", [])
    for item in listed:
        s3.delete_object(Bucket="exports", Key=item["Key"])
    s3.delete_bucket(Bucket="exports")
