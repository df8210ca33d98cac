"""Fixtures of the command tests."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from django.core.management import call_command
from django.db import transaction

from devtools.drop_simulator import DropSimulator
from integrations.consumers.load import ConsumerLoad, Merged
from integrations.services.staff.brokers import broker_create
from tests.conftest import s3_reached_at
from tests.evidence_world import DROP_KEY, evidence_world


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[Merged]:
    """What each consumer registration's merge did (rounds merged as read, or at the end),
    in order."""
    seen: list[Merged] = []
    finish = ConsumerLoad.finish

    def watched(load: ConsumerLoad, *, replace: bool = False) -> Merged:
        merged = finish(load, replace=replace)
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


@pytest.fixture(scope="module")
def evidence_pack(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The evidence world's pack (``tests/evidence_world.py``, the ``broker`` fixture's
    broker), exported once for a module's tests that only read the file (a test copies it
    to change it). The world is made in a transaction rolled back once the pack is
    written, as a test's own would be: the database is left as it was. Being the module's,
    it runs outside the per-test autouse fixtures (``drop_packages_in_tmp`` and the others).

    The pack is read-only, and its digest is checked once the module's tests are done: the
    tests may run as root, whom a file's mode does not stop."""
    directory = tmp_path_factory.mktemp("evidence")
    out = directory / "pack.zip"
    with django_db_blocker.unblock(), transaction.atomic():
        broker = broker_create(broker_id="4821", name="Acme Data", mode="test", actor="test")
        with DropSimulator(api_key=DROP_KEY, broker_id="4821", active_download=True) as drop:
            cycle = evidence_world(broker, drop, directory)
        call_command(
            "evidence", "export", "--broker", "4821", "--cycle", cycle.drop_session_id,
            "--out", str(out), stdout=io.StringIO(),
        )  # fmt: skip
        transaction.set_rollback(True)
    out.chmod(0o444)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    yield out
    changed = hashlib.sha256(out.read_bytes()).hexdigest() != digest
    assert not changed, "a test changed the shared evidence pack: copy it (shutil.copyfile)"
