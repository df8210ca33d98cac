"""gunicorn refuses to start as ``manage.py`` commands do: the settings' refusals, the system
checks' errors (``dropportal.E001``) and keys that cannot read the stored secrets each stop
it with one line, and gunicorn stops instead of restarting workers that cannot start."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet

from integrations.services.brokers import broker_create
from integrations.services.secrets import ENCRYPTION_KEYS_WRONG
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def _gunicorn(**env: str) -> subprocess.CompletedProcess[str]:
    """gunicorn as deployed, run until it exits (a process that serves instead times out)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    defaults = {
        "DJANGO_DEBUG": "false",
        "DROPPORTAL_ALLOW_PRIVATE_TARGETS": "false",
        "DROPPORTAL_PUBLIC_URL": "https://dp.example.com",
    }
    environment = {k: v for k, v in subprocess_env(**{**defaults, **env}).items() if v != "-"}
    return subprocess.run(  # noqa: S603
        [
            *(sys.executable, "-m", "gunicorn", "dropportal.wsgi"),
            *("--config", "python:dropportal.gunicorn_conf"),
            *("--bind", f"127.0.0.1:{port}", "--workers", "2"),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _refusals(stopped: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr's lines without gunicorn's own (timestamped "[...] [INFO] ...")."""
    return [line for line in stopped.stderr.splitlines() if not line.startswith("[")]


def test_a_plain_http_public_url_stops_gunicorn_with_e001() -> None:
    stopped = _gunicorn(DROPPORTAL_PUBLIC_URL="http://dp.example.com")

    assert stopped.returncode != 0
    refusals = _refusals(stopped)
    assert refusals and all("dropportal.E001" in line for line in refusals), stopped.stderr
    assert "App failed to load" in stopped.stderr  # gunicorn stopped, no worker restarted
    assert "Traceback" not in stopped.stderr


def test_a_missing_encryption_key_stops_gunicorn_in_one_line() -> None:
    stopped = _gunicorn(DROPPORTAL_ENCRYPTION_KEYS="-", SECRET_KEY=secrets.token_urlsafe(50))

    assert stopped.returncode != 0
    refusals = set(_refusals(stopped))
    assert len(refusals) == 1, stopped.stderr
    assert "DROPPORTAL_ENCRYPTION_KEYS must be set too" in refusals.pop()
    assert "App failed to load" in stopped.stderr
    assert "Traceback" not in stopped.stderr


def test_keys_that_cannot_read_the_stored_secrets_stop_gunicorn() -> None:
    broker_create(broker_id="4821", name="Acme", drop_api_key="dk_live_1", actor="test")
    stopped = _gunicorn(DROPPORTAL_ENCRYPTION_KEYS=Fernet.generate_key().decode())

    assert stopped.returncode != 0
    assert set(_refusals(stopped)) == {f"error: {ENCRYPTION_KEYS_WRONG}"}, stopped.stderr
    assert "Traceback" not in stopped.stderr
