"""HTTPS: an https public URL passes ``check --deploy`` with nothing to report; a plain-http
one on a host other than loopback is refused at start-up; ``make run``'s loopback URL works."""

from __future__ import annotations

import logging
import secrets
import subprocess
import sys

import pytest

from dropportal.startup import start_refusals
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    defaults = {
        "DJANGO_DEBUG": "false",
        "DROPPORTAL_ALLOW_PRIVATE_TARGETS": "false",
        "DROPPORTAL_BEHIND_TLS_PROXY": "false",
        "SECRET_KEY": secrets.token_urlsafe(60),
    }
    environment = subprocess_env(**{**defaults, **env})
    environment.pop("DROPPORTAL_ALLOWED_HOSTS", None)
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_https_public_url_passes_check_deploy_with_nothing_to_report() -> None:
    checked = _manage("check", "--deploy", DROPPORTAL_PUBLIC_URL="https://dp.example.com")
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_a_plain_http_public_url_is_refused_at_start_up() -> None:
    checked = _manage("check", DROPPORTAL_PUBLIC_URL="http://dp.example.com")
    assert checked.returncode != 0
    assert "dropportal.E001" in checked.stderr
    deploy = _manage("check", "--deploy", DROPPORTAL_PUBLIC_URL="http://dp.example.com")
    assert deploy.returncode != 0


def test_private_targets_do_not_let_a_plain_http_public_url_through() -> None:
    # Private targets open outbound calls; the staff's own logins are another matter.
    checked = _manage(
        "check",
        DROPPORTAL_PUBLIC_URL="http://dp.lab.internal",
        DROPPORTAL_ALLOW_PRIVATE_TARGETS="true",
    )
    assert checked.returncode != 0
    assert "dropportal.E001" in checked.stderr
    assert "DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL=true" in checked.stderr


def test_a_plain_http_lab_set_up_starts_with_its_own_setting_and_a_warning() -> None:
    checked = _manage(
        "check",
        DROPPORTAL_PUBLIC_URL="http://dp.lab.internal",
        DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL="true",
    )
    assert checked.returncode == 0, checked.stderr
    assert "dropportal.W002" in checked.stderr
    assert "may cross the network in clear" in checked.stderr


def test_a_setting_that_opens_a_door_is_logged_at_every_start(
    settings, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DROPPORTAL_PUBLIC_URL = "http://dp.lab.internal"
    settings.DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL = True
    caplog.set_level(logging.WARNING, logger="dropportal.startup")

    assert start_refusals() == []
    (line,) = [r for r in caplog.records if r.name == "dropportal.startup"]
    assert line.levelname == "WARNING"
    assert "DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL is on" in line.getMessage()
    assert "dropportal.W002" in line.getMessage()


def test_make_run_on_loopback_keeps_working() -> None:
    checked = _manage("check", DROPPORTAL_PUBLIC_URL="http://127.0.0.1:8000")
    assert checked.returncode == 0, checked.stderr


def test_the_proxy_ssl_header_is_opt_in() -> None:
    show = (
        "import django; django.setup(); from django.conf import settings; "
        "print(getattr(settings, 'SECURE_PROXY_SSL_HEADER', None))"
    )
    off = _manage("shell", "-c", show, DROPPORTAL_PUBLIC_URL="https://dp.example.com")
    on = _manage(
        "shell",
        "-c",
        show,
        DROPPORTAL_PUBLIC_URL="https://dp.example.com",
        DROPPORTAL_BEHIND_TLS_PROXY="true",
    )
    assert off.stdout.strip().splitlines()[-1] == "None", off.stderr
    assert on.stdout.strip().splitlines()[-1] == "('HTTP_X_FORWARDED_PROTO', 'https')", on.stderr
