"""The secrets the zero-config setup makes on first use (``dropportal.local_state``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dropportal import local_state


def test_a_process_starting_while_a_secret_is_written_never_reads_it_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_state, "VAR_DIR", tmp_path)
    real_open = os.open
    beside: list[str] = []
    started: list[bool] = []

    def open_then_another_process_starts(path: Any, flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        if not started:  # the web server's start, say, while the worker writes the secret
            started.append(True)
            beside.append(local_state.generated_secret("secret_key", lambda: "theirs"))
        return fd

    monkeypatch.setattr(os, "open", open_then_another_process_starts)
    ours = local_state.generated_secret("secret_key", lambda: "ours")
    monkeypatch.setattr(os, "open", real_open)

    assert beside == ["theirs"]  # it found no file, made its own and kept it
    assert ours == "theirs"  # the first secret in place wins: both processes share it
    assert (tmp_path / "secret_key").read_text() == "theirs\n"
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret_key"]  # no draft left


def test_a_secret_is_made_once_and_read_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_state, "VAR_DIR", tmp_path)
    assert local_state.generated_secret("evidence_key", lambda: "first") == "first"
    assert local_state.generated_secret("evidence_key", lambda: "second") == "first"
