"""HTTPS: an https public URL passes ``check --deploy`` with nothing to report; a plain-http
one on a host other than loopback is refused at start-up; ``make run``'s loopback URL works.

A real ``manage.py`` start proves each outcome once (the https deploy check, the refusal);
the other cases run the same ``check`` here, on the settings such a start would read
(tests/started_settings.py)."""

from __future__ import annotations

import io
import logging
import secrets
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from dropportal.startup import start_refusals
from tests.conftest import subprocess_env
from tests.started_settings import settings_started_with, start_with

pytestmark = pytest.mark.django_db

SECRET_KEY = secrets.token_urlsafe(60)


def _environment(**env: str) -> dict[str, str]:
    defaults = {
        "DJANGO_DEBUG": "false",
        "DROPPORTAL_ALLOW_PRIVATE_TARGETS": "false",
        "DROPPORTAL_BEHIND_TLS_PROXY": "false",
        "SECRET_KEY": SECRET_KEY,
    }
    environment = subprocess_env(**{**defaults, **env})
    environment.pop("DROPPORTAL_ALLOWED_HOSTS", None)
    return environment


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        env=_environment(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _check(live: Any, *args: str, **env: str) -> tuple[int, str]:
    """``manage.py check *args`` as a start with ``env`` would run it, here: its exit status
    and what it writes on stderr (a check error: ``SystemCheckError``, status 1)."""
    start_with(live, _environment(**env))
    stderr = io.StringIO()
    try:
        call_command("check", *args, stdout=io.StringIO(), stderr=stderr)
    except SystemCheckError as refused:
        return 1, f"{stderr.getvalue()}{refused}"
    return 0, stderr.getvalue()


def test_an_https_public_url_passes_check_deploy_with_nothing_to_report() -> None:
    checked = _manage("check", "--deploy", DROPPORTAL_PUBLIC_URL="https://dp.example.com")
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_a_plain_http_public_url_is_refused_at_start_up(settings: Any) -> None:
    checked = _manage("check", DROPPORTAL_PUBLIC_URL="http://dp.example.com")
    assert checked.returncode != 0
    assert "dropportal.E001" in checked.stderr
    status, _ = _check(settings, "--deploy", DROPPORTAL_PUBLIC_URL="http://dp.example.com")
    assert status != 0


def test_private_targets_do_not_let_a_plain_http_public_url_through(settings: Any) -> None:
    # Private targets open outbound calls; the staff's own logins are another matter.
    status, stderr = _check(
        settings,
        DROPPORTAL_PUBLIC_URL="http://dp.lab.internal",
        DROPPORTAL_ALLOW_PRIVATE_TARGETS="true",
    )
    assert status != 0
    assert "dropportal.E001" in stderr
    assert "DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL=true" in stderr


def test_a_plain_http_lab_set_up_starts_with_its_own_setting_and_a_warning(
    settings: Any,
) -> None:
    status, stderr = _check(
        settings,
        DROPPORTAL_PUBLIC_URL="http://dp.lab.internal",
        DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL="true",
    )
    assert status == 0, stderr
    assert "dropportal.W002" in stderr
    assert "may cross the network in clear" in stderr


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


@pytest.mark.parametrize("url", ["https://dp.example.com", "http://dp.example.com"])
def test_debug_mode_off_loopback_is_refused_at_start_up(settings: Any, url: str) -> None:
    # Its error pages show settings and request bodies to whoever causes an error.
    status, stderr = _check(settings, DROPPORTAL_PUBLIC_URL=url, DJANGO_DEBUG="true")
    assert status != 0
    assert "dropportal.E005" in stderr
    assert "dropportal.E001" not in stderr  # one reason, the one that stands


def test_debug_mode_on_loopback_starts(settings: Any) -> None:
    status, stderr = _check(
        settings, DROPPORTAL_PUBLIC_URL="http://127.0.0.1:8000", DJANGO_DEBUG="true"
    )
    assert status == 0, stderr


def test_make_run_on_loopback_keeps_working(settings: Any) -> None:
    status, stderr = _check(settings, DROPPORTAL_PUBLIC_URL="http://127.0.0.1:8000")
    assert status == 0, stderr


def test_the_proxy_ssl_header_is_opt_in() -> None:
    off = settings_started_with(_environment(DROPPORTAL_PUBLIC_URL="https://dp.example.com"))
    on = settings_started_with(
        _environment(
            DROPPORTAL_PUBLIC_URL="https://dp.example.com", DROPPORTAL_BEHIND_TLS_PROXY="true"
        )
    )
    # Django's own default when the settings leave it out.
    assert off.get("SECURE_PROXY_SSL_HEADER") is None
    assert on["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")
