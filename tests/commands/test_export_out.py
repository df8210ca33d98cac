"""``--out`` of the exports (``evidence``, ``outcomes``, ``ledger``): a path that cannot be
written is refused in one line before anything happens, and an export is in the ledger only
when its file is in place. The ledger is append-only: an ``*.exported`` event of a file never
written would be a false record for good."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from integrations.management import base
from integrations.models import Broker, LedgerEvent

pytestmark = pytest.mark.django_db

EXPORTS = {
    "evidence": [
        "evidence", "export", "--broker", "4821", "--since", "2026-01-01", "--until", "2026-12-31",
    ],
    "outcomes csv": ["outcomes", "export"],
    "outcomes jsonl": ["outcomes", "export", "--format", "jsonl"],
    "ledger": ["ledger", "export"],
}  # fmt: skip


def _export(command: list[str], out: str) -> None:
    call_command(*command, "--out", out, stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.parametrize("command", EXPORTS.values(), ids=EXPORTS.keys())
def test_each_export_writes_its_file_and_records_it(
    broker: Broker, tmp_path: Path, command: list[str]
) -> None:
    before = LedgerEvent.objects.count()
    _export(command, str(tmp_path / "export.out"))
    assert (tmp_path / "export.out").is_file()
    assert LedgerEvent.objects.count() == before + 1
    assert [p.name for p in tmp_path.iterdir()] == ["export.out"]


@pytest.mark.parametrize("command", EXPORTS.values(), ids=EXPORTS.keys())
@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("{tmp}", r"--out .* is a folder: give the path of a file"),
        ("{tmp}/sub/", r"--out .*sub/ is a folder"),
        ("", r"--out is empty: give the path of the file to write"),
        ("   ", r"--out is empty"),
        ("/nonexist/x.csv", r"--out /nonexist/x\.csv: no such folder: /nonexist"),
        ("{tmp}/file/x.csv", r"--out .*/file/x\.csv: not a folder: .*/file$"),
        # A device or a pipe: the rename would replace it (on a system's /dev/null, for all).
        ("{tmp}/pipe", r"--out .*/pipe is not a regular file"),
    ],
)
def test_an_out_that_cannot_be_written_is_refused_before_anything_is_recorded(
    broker: Broker,
    tmp_path: Path,
    command: list[str],
    out: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # what a relative path would write lands here, and is seen
    (tmp_path / "sub").mkdir()
    (tmp_path / "file").write_text("kept")
    os.mkfifo(tmp_path / "pipe")
    before = LedgerEvent.objects.count()

    with pytest.raises(CommandError, match=message) as refused:
        _export(command, out.format(tmp=tmp_path))

    assert "\n" not in str(refused.value)
    assert LedgerEvent.objects.count() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "pipe", "sub"]
    assert (tmp_path / "pipe").is_fifo()
    assert not any((tmp_path / "sub").iterdir())
    assert (tmp_path / "file").read_text() == "kept"


@pytest.mark.parametrize("command", EXPORTS.values(), ids=EXPORTS.keys())
def test_an_export_whose_file_cannot_be_put_in_place_records_nothing(
    broker: Broker, tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path was fine when checked, but a folder took its name while the export ran: the
    rename fails, and the event appended before it is rolled back with it."""
    opened = base.PartialOutput.__init__

    def then_a_folder_takes_the_name(self: base.PartialOutput, *args: Any) -> None:
        opened(self, *args)
        self.path.mkdir()

    monkeypatch.setattr(base.PartialOutput, "__init__", then_a_folder_takes_the_name)
    out = tmp_path / "export.out"
    before = LedgerEvent.objects.count()

    with pytest.raises(CommandError, match=r"cannot write .*export\.out"):
        _export(command, str(out))

    assert LedgerEvent.objects.count() == before
    assert [p.name for p in tmp_path.iterdir()] == ["export.out"]  # the folder, no .partial
    assert out.is_dir()
