"""Staff login: a second factor (TOTP, single-use recovery codes) required whenever
DATABASE_URL is set, failed logins locked out per account and address, 8-hour idle sessions.

These tests keep the MFA setting as the settings module derived it (``staff_mfa`` marker):
``make test`` always sets DATABASE_URL, so it is on, as in a real deployment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from integrations.models import LedgerEvent
from integrations.services.staff_mfa import staff_mfa_enrol, staff_mfa_pending_device
from tests.conftest import subprocess_env

pytestmark = [pytest.mark.django_db, pytest.mark.staff_mfa]

PASSWORD = "pw-alice-123-long"
INDEX = "/admin/"


def _code(device: TOTPDevice) -> str:
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_superuser("alice", "alice@example.com", PASSWORD)


@pytest.fixture
def recovery_codes(alice: User) -> list[str]:
    device = staff_mfa_pending_device(user=alice)
    codes = staff_mfa_enrol(user=alice, device=device, token=_code(device), actor="test")
    TOTPDevice.objects.update(last_t=-1)  # the enrolment's code may be used again to log in
    return codes


def _password_step(client: Client, password: str = PASSWORD):  # type: ignore[no-untyped-def]
    return client.post(
        reverse("admin:login"), {"username": "alice", "password": password, "next": INDEX}
    )


def test_mfa_is_required_whenever_database_url_is_set() -> None:
    assert os.environ.get("DATABASE_URL"), "make test sets DATABASE_URL"
    assert settings.DROPPORTAL_STAFF_MFA_REQUIRED is True
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.DROPPORTAL_STAFF_MFA_REQUIRED)",
        ],
        env={**subprocess_env(), "DJANGO_SETTINGS_MODULE": "dropportal.settings"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "True"


def test_a_password_alone_opens_nothing_and_leads_to_enrolment(alice: User, client: Client) -> None:
    response = _password_step(client)
    assert response.status_code == 302
    assert urlsplit(response["Location"]).path == reverse("admin:mfa_verify")
    assert client.get(INDEX).status_code == 302  # not in yet
    assert client.get(reverse("admin:integrations_broker_changelist")).status_code == 302

    verify = client.get(response["Location"])
    enrol_url = verify["Location"]
    assert urlsplit(enrol_url).path == reverse("admin:mfa_enrol")
    page = client.get(enrol_url)
    text = page.content.decode()
    device = TOTPDevice.objects.get(user=alice, confirmed=False)
    assert "<svg" in text, "a QR code"
    assert "otpauth://totp/" in text
    secret = re.search(r'id="dp-mfa-secret">([A-Z2-7]+)<', text)
    assert secret and secret.group(1)

    done = client.post(enrol_url, {"otp_token": _code(device), "next": INDEX})
    codes = re.findall(r"<li><code>([a-z2-7]+)</code></li>", done.content.decode())
    assert len(codes) == 10, "ten recovery codes, shown once"
    assert client.get(INDEX).status_code == 200
    assert LedgerEvent.objects.get(kind="staff_user.mfa_enrolled").subject == "alice"


def test_a_wrong_code_at_enrolment_is_refused(alice: User, client: Client) -> None:
    _password_step(client)
    device = staff_mfa_pending_device(user=alice)
    wrong = f"{(int(_code(device)) + 500_000) % 1_000_000:06d}"
    page = client.post(reverse("admin:mfa_enrol"), {"otp_token": wrong})
    assert b"does not match" in page.content
    assert client.get(INDEX).status_code == 302


def test_an_enrolled_member_needs_the_code(
    alice: User, recovery_codes: list[str], client: Client
) -> None:
    response = _password_step(client)
    assert urlsplit(response["Location"]).path == reverse("admin:mfa_verify")
    assert client.get(INDEX).status_code == 302

    refused = client.post(reverse("admin:mfa_verify"), {"otp_token": "000000", "next": INDEX})
    assert b"does not match" in refused.content
    assert client.get(INDEX).status_code == 302

    # A wrong code slows the next tries down (django-otp's throttle): as after that wait.
    TOTPDevice.objects.update(throttling_failure_count=0, throttling_failure_timestamp=None)
    device = TOTPDevice.objects.get(user=alice)
    accepted = client.post(reverse("admin:mfa_verify"), {"otp_token": _code(device), "next": INDEX})
    assert accepted.status_code == 302
    assert accepted["Location"] == INDEX
    assert client.get(INDEX).status_code == 200


def test_a_recovery_code_works_once(alice: User, recovery_codes: list[str]) -> None:
    first, second = Client(), Client()
    _password_step(first)
    first.post(reverse("admin:mfa_verify"), {"otp_token": recovery_codes[0]})
    assert first.get(INDEX).status_code == 200

    _password_step(second)
    second.post(reverse("admin:mfa_verify"), {"otp_token": recovery_codes[0]})
    assert second.get(INDEX).status_code == 302, "a recovery code was used twice"


def test_force_login_is_not_enough_when_mfa_is_required(alice: User, client: Client) -> None:
    client.force_login(alice)
    response = client.get(INDEX)
    assert response.status_code == 302
    login = client.get(response["Location"])
    assert urlsplit(login["Location"]).path == reverse("admin:mfa_verify")
    assert parse_qs(urlsplit(login["Location"]).query)["next"] == [INDEX]


def test_failed_logins_lock_out_the_account_from_that_address(alice: User) -> None:
    attacker, colleague = Client(REMOTE_ADDR="203.0.113.9"), Client(REMOTE_ADDR="198.51.100.4")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _password_step(attacker, password="wrong-guess").status_code == 200
    assert _password_step(attacker, password="wrong-guess").status_code == 429
    locked = _password_step(attacker)  # the right password, too late
    assert locked.status_code == 429
    assert "_auth_user_id" not in attacker.session

    # Another address is not locked out of the same account.
    assert _password_step(colleague).status_code == 302


def test_sessions_expire_after_eight_idle_hours(alice: User, recovery_codes: list[str]) -> None:
    client = Client()
    _password_step(client)
    client.post(reverse("admin:mfa_verify"), {"otp_token": recovery_codes[1]})
    response = client.get(INDEX)
    assert response.status_code == 200
    # Every request sends the cookie again: it lasts 8 hours from the latest request.
    assert int(response.cookies["sessionid"]["max-age"]) == 8 * 60 * 60
    again = client.get(INDEX)
    assert int(again.cookies["sessionid"]["max-age"]) == 8 * 60 * 60


def test_a_superuser_resets_a_lost_factor(
    alice: User, recovery_codes: list[str], client: Client, settings: Any
) -> None:
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False  # root's own login is not the point here
    root = User.objects.create_superuser("root", "root@example.com", "pw-root-123-long")
    client.force_login(root)
    client.post(
        reverse("admin:auth_user_changelist"),
        {"action": "reset_mfa", "_selected_action": [alice.pk]},
    )

    assert not TOTPDevice.objects.filter(user=alice).exists()
    assert LedgerEvent.objects.get(kind="staff_user.mfa_reset").actor == "staff:root"
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = True
    again = Client()
    _password_step(again)
    assert urlsplit(again.get(reverse("admin:mfa_verify"))["Location"]).path == reverse(
        "admin:mfa_enrol"
    )
