"""gunicorn refuses to start as ``manage.py`` commands do: the settings' refusals, the system
checks' errors (``dropportal.E001``) and keys that cannot read the stored secrets each stop
it with one line. With the project's gunicorn settings the master refuses before any worker
starts; without them each worker refuses, and gunicorn stops instead of restarting them."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet

from integrations.services.staff.brokers import broker_create
from integrations.services.staff.secrets import ENCRYPTION_KEYS_WRONG
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def _gunicorn(*, conf: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """gunicorn as deployed (``conf``: with ``dropportal.gunicorn_conf``), run until it exits
    (one that serves instead times out)."""
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
            *(("--config", "python:dropportal.gunicorn_conf") if conf else ()),
            # One worker without the settings: two refusing at once can trip gunicorn's own
            # shutdown into a traceback of its own.
            *("--bind", f"127.0.0.1:{port}", "--workers", "2" if conf else "1"),
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
    (refusal,) = _refusals(stopped)
    assert refusal.startswith("error: DROPPORTAL_PUBLIC_URL http://dp.example.com is plain http")
    assert "dropportal.E001" in refusal
    assert "Booting worker" not in stopped.stderr  # refused before any worker started
    assert "Traceback" not in stopped.stderr


def test_without_the_gunicorn_settings_the_workers_refuse_and_gunicorn_stops() -> None:
    stopped = _gunicorn(conf=False, DROPPORTAL_PUBLIC_URL="http://dp.example.com")

    assert stopped.returncode != 0
    (refusal,) = set(_refusals(stopped))
    assert "dropportal.E001" in refusal
    assert "App failed to load" in stopped.stderr  # gunicorn stopped, no worker restarted
    assert "Traceback" not in stopped.stderr


def test_a_missing_encryption_key_stops_gunicorn_in_one_line() -> None:
    stopped = _gunicorn(DROPPORTAL_ENCRYPTION_KEYS="-", SECRET_KEY=secrets.token_urlsafe(50))

    assert stopped.returncode != 0
    (refusal,) = _refusals(stopped)
    assert "DROPPORTAL_ENCRYPTION_KEYS must be set too" in refusal
    assert "Traceback" not in stopped.stderr


def test_keys_that_cannot_read_the_stored_secrets_stop_gunicorn() -> None:
    broker_create(broker_id="4821", name="Acme", drop_api_key="dk_live_1", actor="test")
    stopped = _gunicorn(DROPPORTAL_ENCRYPTION_KEYS=Fernet.generate_key().decode())

    assert stopped.returncode != 0
    assert _refusals(stopped) == [f"error: {ENCRYPTION_KEYS_WRONG}"], stopped.stderr
    assert "Traceback" not in stopped.stderr
