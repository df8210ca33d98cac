"""Fixtures of the command tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

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


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An empty bucket ``exports`` (the server is reset per test), reached the way a
    deployment reaches it: boto3's credential chain and DROPPORTAL_S3_ENDPOINT_URL."""
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.DROPPORTAL_S3_ENDPOINT_URL = s3_server
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="exports")
    yield s3
    listed = s3.list_objects_v2(Bucket="exports").get("Contents", [])
    for item in listed:
        s3.delete_object(Bucket="exports", Key=item["Key"])
    s3.delete_bucket(Bucket="exports")
