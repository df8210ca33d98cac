"""The consumer services called directly: an import takes its files as a list, a replace
forgets what its files do not list, and each file is named in the ledger."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from integrations.consumers.sources import ConsumerSource, consumer_sources
from integrations.models import Broker, Consumer, LedgerEvent
from integrations.services.cycle.consumers import consumers_import, consumers_replace

pytestmark = pytest.mark.django_db

FIRST = "remote_identifier,email\nC-1,anna@example.com\nC-2,bob@example.com\n"
SECOND = "remote_identifier,phone\nC-3,+1 (415) 555-0123\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def files(tmp_path: Path, **texts: str) -> list[ConsumerSource]:
    found: list[ConsumerSource] = []
    for name, text in texts.items():
        path = tmp_path / f"{name}.csv"
        path.write_text(text, encoding="utf-8")
        found += consumer_sources(str(path)).files
    return found


def test_an_import_reads_every_file_of_its_list_as_one_registration(
    broker: Broker, tmp_path: Path
) -> None:
    result = consumers_import(
        broker=broker,
        files=files(tmp_path, first=FIRST, second=SECOND),
        hashed=False,
        actor="test",
        source="file:nightly",
    )

    assert (result.rows_read, result.consumers_created, result.hashes_added) == (3, 3, 3)
    assert sorted(Consumer.objects.values_list("remote_identifier", flat=True)) == [
        "C-1",
        "C-2",
        "C-3",
    ]
    event = LedgerEvent.objects.get(kind="consumers.registered")
    assert event.data["files"] == [
        {"name": f"{name}.csv", "size": len(text), "sha256": sha256(text)}
        for name, text in (("first", FIRST), ("second", SECOND))
    ]


def test_a_replace_forgets_the_consumers_its_files_do_not_list(
    broker: Broker, tmp_path: Path
) -> None:
    consumers_import(
        broker=broker,
        files=files(tmp_path, first=FIRST + "C-4,dan@example.com\n"),
        hashed=False,
        actor="test",
        source="file:first",
    )

    result = consumers_replace(
        broker=broker,
        files=files(tmp_path, again=FIRST),
        hashed=False,
        actor="test",
        source="file:again",
        force=True,  # one of three is more than the default 5 %
    )

    assert result.consumers_forgotten == 1
    assert sorted(Consumer.objects.values_list("remote_identifier", flat=True)) == ["C-1", "C-2"]
    replaced = LedgerEvent.objects.get(kind="consumers.replaced")
    assert (replaced.data["consumers_forgotten"], replaced.data["forced"]) == (1, True)
