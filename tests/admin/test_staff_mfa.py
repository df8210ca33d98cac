"""Staff login: a second factor (TOTP, single-use recovery codes) required whenever
DATABASE_URL is set, failed logins locked out per account and address, 8-hour idle sessions.
An enrolment belongs to its session and asks for the password again; a reset ends every
session; a wrong code slows only its own factor; a code is spent once even when sent twice at
once; seeds and codes are encrypted at rest.

These tests keep the MFA setting as the settings module derived it (``staff_mfa`` marker):
``make test`` always sets DATABASE_URL, so it is on, as in a real deployment.
"""

from __future__ import annotations

import datetime as dt
import importlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from base64 import b32decode, b32encode
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from axes.models import AccessAttempt
from cryptography.fernet import Fernet
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection, connections
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_otp.oath import TOTP

from integrations import encryption
from integrations.models import AdminSession, LedgerEvent, StaffRecoveryCodes, StaffTotpDevice
from integrations.services.staff.staff_mfa import (
    staff_mfa_enrol,
    staff_mfa_pending_device,
    staff_mfa_recovery_codes_renew,
    staff_mfa_reset,
    staff_mfa_verify,
    staff_password_reset_record,
)
from tests.conftest import database_url, sessions_waiting_for_locks, subprocess_env

pytestmark = [pytest.mark.django_db, pytest.mark.staff_mfa]

PASSWORD = "pw-alice-123-long"
INDEX = "/admin/"


def _code(device: StaffTotpDevice) -> str:
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_superuser("alice", "alice@example.com", PASSWORD)


@pytest.fixture
def recovery_codes(alice: User) -> list[str]:
    device = staff_mfa_pending_device(user=alice, session_key="enrolling")
    codes = staff_mfa_enrol(
        user=alice, session_key="enrolling", token=_code(device), password=PASSWORD, actor="test"
    )
    StaffTotpDevice.objects.update(last_t=-1)  # the enrolment's code may be used again to log in
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
            # The settings as a new process reads them; loading every app (django.setup)
            # changes none of them, so it is not done.
            "from django.conf import settings; print(settings.DROPPORTAL_STAFF_MFA_REQUIRED)",
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
    device = StaffTotpDevice.objects.get(user=alice, confirmed=False)
    assert "<svg" in text, "a QR code"
    assert "otpauth://totp/" in text
    secret = re.search(r'id="dp-mfa-secret">([A-Z2-7]+)<', text)
    assert secret and secret.group(1)

    done = client.post(enrol_url, {"otp_token": _code(device), "password": PASSWORD, "next": INDEX})
    codes = re.findall(r"<li><code>([a-z2-7]+)</code></li>", done.content.decode())
    assert len(codes) == 10, "ten recovery codes, shown once"
    assert client.get(INDEX).status_code == 200
    assert LedgerEvent.objects.get(kind="staff_user.mfa_enrolled").subject == "alice"


def test_a_wrong_code_at_enrolment_is_refused(alice: User, client: Client) -> None:
    _password_step(client)
    device = staff_mfa_pending_device(user=alice, session_key=str(client.session.session_key))
    wrong = f"{(int(_code(device)) + 500_000) % 1_000_000:06d}"
    page = client.post(reverse("admin:mfa_enrol"), {"otp_token": wrong, "password": PASSWORD})
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
    StaffTotpDevice.objects.update(throttling_failure_count=0, throttling_failure_timestamp=None)
    device = StaffTotpDevice.objects.get(user=alice)
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


def test_an_ipv6_client_counts_by_its_64(alice: User) -> None:
    # A client that takes a new address of its /64 for every guess is still one client.
    for n in range(1, settings.AXES_FAILURE_LIMIT):
        rotating = Client(REMOTE_ADDR=f"2001:db8:1:2::{n:x}")
        assert _password_step(rotating, password="wrong-guess").status_code == 200
    last = Client(REMOTE_ADDR="2001:db8:1:2:ffff::1")
    assert _password_step(last, password="wrong-guess").status_code == 429
    assert _password_step(Client(REMOTE_ADDR="2001:db8:1:2::99")).status_code == 429
    assert _password_step(Client(REMOTE_ADDR="2001:db8:1:3::1")).status_code == 302


def test_failures_from_every_address_together_reach_the_accounts_ceiling(alice: User) -> None:
    # The owner signed in from their office before.
    assert _password_step(Client(REMOTE_ADDR="198.51.100.4")).status_code == 302
    below_each_pair = settings.AXES_FAILURE_LIMIT - 1
    guessers = -(-settings.DROPPORTAL_STAFF_LOGIN_ACCOUNT_FAILURE_LIMIT // below_each_pair)
    for n in range(guessers):
        guesser = Client(REMOTE_ADDR=f"203.0.113.{n + 1}")
        for _ in range(below_each_pair):
            _password_step(guesser, password="wrong-guess")

    # Every new address is locked out of the account, even with the right password...
    assert _password_step(Client(REMOTE_ADDR="192.0.2.200")).status_code == 429
    # ...but not the owner at an address they signed in from before.
    assert _password_step(Client(REMOTE_ADDR="198.51.100.4")).status_code == 302


def test_a_proxy_in_front_with_the_setting_off_is_told(
    alice: User, client: Client, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    from integrations import client_address

    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False
    settings.DROPPORTAL_BEHIND_TLS_PROXY = False
    client_address._warn_proxy_setting_missing.cache_clear()
    proxied = {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "203.0.113.7"}
    with caplog.at_level("WARNING", logger="integrations.client_address"):
        for _ in range(2):
            client.post(
                reverse("admin:login"),
                {"username": "alice", "password": "wrong-guess"},
                **proxied,  # type: ignore[arg-type]
            )
    warnings = [r for r in caplog.records if "DROPPORTAL_BEHIND_TLS_PROXY" in r.getMessage()]
    assert len(warnings) == 1, "one WARNING per process"
    assert warnings[0].levelname == "WARNING"

    client.force_login(alice)
    page = client.get(INDEX, **proxied)  # type: ignore[arg-type]
    assert b'id="proxy-setting-missing"' in page.content
    assert b'id="proxy-setting-missing"' not in client.get(INDEX).content  # no proxy: quiet
    settings.DROPPORTAL_BEHIND_TLS_PROXY = True
    assert b'id="proxy-setting-missing"' not in client.get(INDEX, **proxied).content  # type: ignore[arg-type]


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

    assert not StaffTotpDevice.objects.filter(user=alice).exists()
    assert LedgerEvent.objects.get(kind="staff_user.mfa_reset").actor == "staff:root"
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = True
    again = Client()
    _password_step(again)
    assert urlsplit(again.get(reverse("admin:mfa_verify"))["Location"]).path == reverse(
        "admin:mfa_enrol"
    )


# -- enrolment belongs to one session and asks for the password again ----------------------


def _enrol_page_secret(client: Client) -> str:
    page = client.get(reverse("admin:mfa_enrol")).content.decode()
    secret = re.search(r'id="dp-mfa-secret">([A-Z2-7]+)<', page)
    assert secret, "the enrolment page shows a secret"
    return secret.group(1)


def _code_of(secret: str) -> str:
    return f"{TOTP(b32decode(secret)).token():06d}"


def test_each_session_enrols_its_own_seed_and_cannot_confirm_anothers(alice: User) -> None:
    owner, intruder = Client(), Client()
    _password_step(owner)
    _password_step(intruder)  # the same password, another session
    owners_secret = _enrol_page_secret(owner)
    assert _enrol_page_secret(owner) == owners_secret, "the same seed until confirmed"
    assert _enrol_page_secret(intruder) != owners_secret, "another session, another seed"

    # The intruder cannot confirm the owner's seed (the code of a seed it was never shown).
    taken = intruder.post(
        reverse("admin:mfa_enrol"), {"otp_token": _code_of(owners_secret), "password": PASSWORD}
    )
    assert b"does not match" in taken.content
    assert not StaffTotpDevice.objects.filter(user=alice, confirmed=True).exists()

    done = owner.post(
        reverse("admin:mfa_enrol"),
        {"otp_token": _code_of(owners_secret), "password": PASSWORD, "next": INDEX},
    )
    assert done.status_code == 200
    assert owner.get(INDEX).status_code == 200


def test_enrolment_asks_for_the_password_again(alice: User, client: Client) -> None:
    _password_step(client)
    secret = _enrol_page_secret(client)
    for password in ("", "not-the-password"):
        refused = client.post(
            reverse("admin:mfa_enrol"), {"otp_token": _code_of(secret), "password": password}
        )
        assert b"not the account&#x27;s password" in refused.content
    assert not StaffTotpDevice.objects.filter(user=alice, confirmed=True).exists()
    assert client.get(INDEX).status_code == 302
    assert not LedgerEvent.objects.filter(kind="staff_user.mfa_enrolled").exists()


def _fully_logged_in(recovery_code: str) -> Client:
    member = Client()
    _password_step(member)
    member.post(reverse("admin:mfa_verify"), {"otp_token": recovery_code})
    assert member.get(INDEX).status_code == 200
    return member


def test_signing_in_over_another_members_session_is_a_sign_in_with_its_own_second_step(
    alice: User, recovery_codes: list[str]
) -> None:
    # Alice is fully signed in; from her browser, Bob's username and password are posted.
    member = _fully_logged_in(recovery_codes[0])
    User.objects.create_user("bob", "bob@example.com", "pw-bob-123-long", is_staff=True)
    login = reverse("admin:login")
    wrong = member.post(login, {"username": "bob", "password": "wrong", "next": INDEX})
    assert wrong.status_code == 200, "refused: Alice stays signed in, no sign-in recorded"

    bob = member.post(login, {"username": "bob", "password": "pw-bob-123-long", "next": INDEX})

    assert member.session["_auth_user_id"] == str(User.objects.get(username="bob").pk)
    assert urlsplit(bob["Location"]).path == reverse("admin:mfa_verify"), "Alice's is not his"
    assert member.get(INDEX).status_code == 302
    secret = _enrol_page_secret(member)
    member.post(
        reverse("admin:mfa_enrol"), {"otp_token": _code_of(secret), "password": "pw-bob-123-long"}
    )
    assert member.get(INDEX).status_code == 200
    signed_in = LedgerEvent.objects.filter(kind="staff_user.signed_in").order_by("id")
    assert [e.subject for e in signed_in] == ["alice", "bob"]


def _signed_in() -> list[dict[str, Any]]:
    return [e.data for e in LedgerEvent.objects.filter(kind="staff_user.signed_in").order_by("id")]


def test_a_password_without_the_second_factor_is_no_sign_in_in_the_ledger(
    alice: User, recovery_codes: list[str], client: Client
) -> None:
    _password_step(client)  # e.g. a stolen password, and no phone
    client.post(reverse("admin:mfa_verify"), {"otp_token": "000000", "next": INDEX})
    assert client.get(INDEX).status_code == 302
    assert _signed_in() == []

    client.post(reverse("admin:mfa_verify"), {"otp_token": recovery_codes[0], "next": INDEX})
    assert client.get(INDEX).status_code == 200
    assert _signed_in() == [{"method": "password", "second_factor": "recovery_code"}]
    (event,) = LedgerEvent.objects.filter(kind="staff_user.signed_in")
    assert (event.subject, event.actor) == ("alice", "staff:alice")


def test_a_first_sign_in_is_recorded_once_its_second_factor_is_enrolled(
    alice: User, client: Client
) -> None:
    _password_step(client)
    secret = _enrol_page_secret(client)
    assert _signed_in() == []
    client.post(reverse("admin:mfa_enrol"), {"otp_token": _code_of(secret), "password": PASSWORD})
    assert _signed_in() == [{"method": "password", "second_factor": "app"}]


def test_signing_in_again_from_a_session_that_passed_the_second_factor_is_recorded(
    alice: User, recovery_codes: list[str]
) -> None:
    member = _fully_logged_in(recovery_codes[0])
    again = _password_step(member)  # the same member: the session keeps its second factor
    assert member.get(again["Location"])["Location"] == INDEX
    assert _signed_in() == [
        {"method": "password", "second_factor": "recovery_code"},
        {"method": "password"},
    ]


@pytest.fixture
def root(db: None, settings: Any) -> Client:
    """A superuser's session (their own second step is not the point of these tests)."""
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-12345"))
    return client


def test_resetting_mfa_ends_every_session_of_the_member(
    alice: User, recovery_codes: list[str], root: Client, settings: Any
) -> None:
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = True
    member = _fully_logged_in(recovery_codes[0])
    half_open = Client()
    _password_step(half_open)  # e.g. someone who had the password, waiting at the second step

    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False
    root.post(
        reverse("admin:auth_user_changelist"),
        {"action": "reset_mfa", "_selected_action": [alice.pk]},
    )
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = True

    assert "_auth_user_id" in root.session, "the superuser's own session stays"
    for ended in (member, half_open):
        assert "_auth_user_id" not in ended.session
        gone = ended.get(reverse("admin:mfa_enrol"))
        assert urlsplit(gone["Location"]).path == reverse("admin:login")
    event = LedgerEvent.objects.get(kind="staff_user.mfa_reset")
    assert (event.subject, event.actor, event.data["sessions_ended"]) == ("alice", "staff:root", 2)


def test_a_password_reset_ends_every_session_and_names_the_superuser(
    alice: User, recovery_codes: list[str], root: Client, settings: Any
) -> None:
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = True
    member = _fully_logged_in(recovery_codes[0])
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False
    new_password = "a-new-pw-for-alice-9"
    changed = root.post(
        reverse("admin:auth_user_password_change", args=[alice.pk]),
        {"password1": new_password, "password2": new_password, "usable_password": "true"},
    )
    assert changed.status_code == 302, changed.content[:500]
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = True

    assert not any(
        s.get_decoded().get("_auth_user_id") == str(alice.pk) for s in AdminSession.objects.all()
    )
    assert member.get(INDEX).status_code == 302
    assert "_auth_user_id" in root.session
    event = LedgerEvent.objects.get(kind="staff_user.password_reset")
    assert (event.subject, event.actor, event.data["sessions_ended"]) == ("alice", "staff:root", 1)
    assert "pw" not in json.dumps(event.data)


# -- the second factor itself --------------------------------------------------------------


def test_wrong_recovery_codes_do_not_slow_the_app_down_nor_the_reverse(
    alice: User, recovery_codes: list[str], client: Client
) -> None:
    _password_step(client)
    for _ in range(3):
        refused = client.post(reverse("admin:mfa_verify"), {"otp_token": "aaaaaaaa"})
        assert b"does not match" in refused.content
    device = StaffTotpDevice.objects.get(user=alice)
    assert device.throttling_failure_count == 0
    accepted = client.post(reverse("admin:mfa_verify"), {"otp_token": _code(device), "next": INDEX})
    assert accepted.status_code == 302
    assert client.get(INDEX).status_code == 200

    # The reverse: wrong app codes leave the recovery codes alone (their own count cleared
    # first, as after the wait the tries above asked for).
    StaffRecoveryCodes.objects.update(throttling_failure_count=0, throttling_failure_timestamp=None)
    other = Client()
    _password_step(other)
    for _ in range(3):
        other.post(reverse("admin:mfa_verify"), {"otp_token": "000000"})
    assert StaffRecoveryCodes.objects.get(user=alice).throttling_failure_count == 0
    other.post(reverse("admin:mfa_verify"), {"otp_token": recovery_codes[0]})
    assert other.get(INDEX).status_code == 200


def test_each_wrong_code_is_in_the_ledger_and_the_growing_delay_bounds_them(
    alice: User, recovery_codes: list[str], client: Client
) -> None:
    _password_step(client)  # a stolen password: its holder guesses codes
    device = StaffTotpDevice.objects.get(user=alice)
    wrong = f"{(int(_code(device)) + 500_000) % 1_000_000:06d}"
    client.post(reverse("admin:mfa_verify"), {"otp_token": wrong})
    assert StaffTotpDevice.objects.get().get_throttle_factor() == 1, "django-otp's delay is on"
    # Within the delay (held a minute, however slow this machine): refused before any code is
    # checked, the right one too, and not recorded: the delay, doubling at each wrong code,
    # bounds the events.
    later = timezone.now() + dt.timedelta(minutes=1)
    StaffTotpDevice.objects.update(throttling_failure_timestamp=later)
    for code in (wrong, _code(device)):
        refused = client.post(reverse("admin:mfa_verify"), {"otp_token": code})
        assert b"does not match" in refused.content
    client.post(reverse("admin:mfa_verify"), {"otp_token": "abcdefgh"})  # a recovery code's shape

    failed = LedgerEvent.objects.filter(kind="staff_user.mfa_failed").order_by("id")
    assert [(e.subject, e.actor, e.data) for e in failed] == [
        ("alice", "staff:alice", {"factor": "app", "failures": 1}),
        ("alice", "staff:alice", {"factor": "recovery_code", "failures": 1}),
    ]
    assert not LedgerEvent.objects.filter(kind="staff_user.signed_in").exists()

    # Past the delay (1 s after one failure), the next wrong code is checked and recorded.
    a_while_ago = timezone.now() - dt.timedelta(seconds=2)
    StaffTotpDevice.objects.update(throttling_failure_timestamp=a_while_ago)
    client.post(reverse("admin:mfa_verify"), {"otp_token": wrong})
    assert failed.last().data == {"factor": "app", "failures": 2}  # type: ignore[union-attr]


def test_staff_renew_their_recovery_codes_with_their_password(
    alice: User, recovery_codes: list[str]
) -> None:
    member = _fully_logged_in(recovery_codes[0])
    page = member.get(reverse("admin:mfa_recovery_codes"))
    assert page.status_code == 200
    assert b"9 unused recovery codes" in page.content

    refused = member.post(reverse("admin:mfa_recovery_codes"), {"password": "wrong"})
    assert b"not the account&#x27;s password" in refused.content
    assert not LedgerEvent.objects.filter(kind="staff_user.mfa_recovery_codes_renewed").exists()

    renewed = member.post(reverse("admin:mfa_recovery_codes"), {"password": PASSWORD})
    codes = re.findall(r"<li><code>([a-z2-7]+)</code></li>", renewed.content.decode())
    assert len(codes) == 10
    assert not set(codes) & set(recovery_codes)
    event = LedgerEvent.objects.get(kind="staff_user.mfa_recovery_codes_renewed")
    assert (event.subject, event.actor) == ("alice", "staff:alice")
    assert not any(code in json.dumps(event.data) for code in codes)

    old, new = Client(), Client()
    _password_step(old)
    old.post(reverse("admin:mfa_verify"), {"otp_token": recovery_codes[1]})
    assert old.get(INDEX).status_code == 302, "the old codes stopped working"
    StaffRecoveryCodes.objects.update(throttling_failure_count=0, throttling_failure_timestamp=None)
    _password_step(new)
    new.post(reverse("admin:mfa_verify"), {"otp_token": codes[0]})
    assert new.get(INDEX).status_code == 200


def test_new_codes_before_enrolling_are_refused_without_counting_a_right_password(
    alice: User,
) -> None:
    # The lockout counts an error keyed "password" as a wrong password
    # (password_asked_again): a right one with nothing enrolled must not be one.
    with pytest.raises(ValidationError) as refused:
        staff_mfa_recovery_codes_renew(user=alice, password=PASSWORD, actor="staff:alice")
    assert "password" not in refused.value.message_dict
    with pytest.raises(ValidationError) as wrong:
        staff_mfa_recovery_codes_renew(user=alice, password="wrong", actor="staff:alice")
    assert "password" in wrong.value.message_dict


def test_a_page_that_needs_the_second_factor_keeps_renewal_behind_it(
    alice: User, recovery_codes: list[str], client: Client
) -> None:
    _password_step(client)  # the password only
    response = client.post(reverse("admin:mfa_recovery_codes"), {"password": PASSWORD})
    assert response.status_code == 302
    assert not LedgerEvent.objects.filter(kind="staff_user.mfa_recovery_codes_renewed").exists()


def test_seeds_and_recovery_codes_are_encrypted_and_reencrypted(alice: User, settings: Any) -> None:
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.DROPPORTAL_ENCRYPTION_KEYS = [old_key]
    device = staff_mfa_pending_device(user=alice, session_key="s")
    codes = staff_mfa_enrol(
        user=alice, session_key="s", token=_code(device), password=PASSWORD, actor="test"
    )
    seed = device.seed

    def stored() -> tuple[str, str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT seed FROM integrations_stafftotpdevice")
            (stored_seed,) = cursor.fetchone()
            cursor.execute("SELECT codes FROM integrations_staffrecoverycodes")
            (stored_codes,) = cursor.fetchone()
        return stored_seed, stored_codes

    before = stored()
    assert seed not in before[0]
    assert b32encode(device.bin_key).decode() not in before[0]
    assert not any(code in before[1] for code in codes)
    assert encryption.decrypt(before[0]) == seed

    settings.DROPPORTAL_ENCRYPTION_KEYS = [new_key, old_key]
    call_command("secrets", "reencrypt", stdout=io.StringIO())
    after = stored()
    assert after[0] != before[0] and after[1] != before[1]
    settings.DROPPORTAL_ENCRYPTION_KEYS = [new_key]  # the old key gone: both still read
    StaffTotpDevice.objects.update(last_t=-1)
    assert (
        staff_mfa_verify(user=alice, token=_code(StaffTotpDevice.objects.get()), actor="test")
        is not None
    )
    assert staff_mfa_verify(user=alice, token=codes[0], actor="test") is not None


@pytest.mark.django_db(transaction=True)  # two threads and a second connection see the rows
def test_one_recovery_code_sent_twice_at_once_is_accepted_once(
    alice: User, recovery_codes: list[str]
) -> None:
    accepted: list[bool] = []

    def spend() -> None:
        try:
            accepted.append(
                staff_mfa_verify(user=alice, token=recovery_codes[0], actor="test") is not None
            )
        finally:
            connections.close_all()

    # Another transaction holds the codes' row: both requests reach it and wait together
    # (or, were the row not locked, both finish reading the same unused code).
    holder = psycopg.connect(database_url())
    try:
        holder.execute("SELECT 1 FROM integrations_staffrecoverycodes FOR UPDATE")
        threads = [threading.Thread(target=spend) for _ in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() + sum(not t.is_alive() for t in threads) < 2:
            assert time.monotonic() < deadline, "the two requests neither waited nor ended"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(accepted) == [False, True]
    assert StaffRecoveryCodes.objects.get(user=alice).remaining == 9


def test_the_migration_moves_enrolled_factors_out_of_django_otps_clear_tables(
    alice: User,
) -> None:
    from django.apps import apps as django_apps
    from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
    from django_otp.plugins.otp_totp.models import TOTPDevice

    totp = TOTPDevice.objects.create(user=alice, name="authenticator app", confirmed=True)
    static = StaticDevice.objects.create(user=alice, name="recovery codes", confirmed=True)
    StaticToken.objects.bulk_create(
        StaticToken(device=static, token=t) for t in ("abcdefgh", "ijklmnop")
    )
    (path,) = (Path(settings.BASE_DIR) / "integrations" / "migrations").glob(
        "*_staff_mfa_encrypted.py"
    )
    migration = importlib.import_module(f"integrations.migrations.{path.stem}")
    migration.move_devices_encrypted(django_apps, None)

    assert not TOTPDevice.objects.exists() and not StaticDevice.objects.exists()
    moved = StaffTotpDevice.objects.get(user=alice, confirmed=True)
    assert moved.bin_key == totp.bin_key
    with connection.cursor() as cursor:
        cursor.execute("SELECT seed FROM integrations_stafftotpdevice")
        assert totp.key not in cursor.fetchone()[0]
    assert staff_mfa_verify(user=alice, token="ijklmnop", actor="test") is not None
    assert staff_mfa_verify(user=alice, token=_code(moved), actor="test") is not None


def test_the_password_asked_again_counts_toward_the_lockout(
    alice: User, recovery_codes: list[str]
) -> None:
    # A session left open (or stolen) is no way to guess the password at leisure.
    member = _fully_logged_in(recovery_codes[0])
    for _ in range(settings.AXES_FAILURE_LIMIT):
        member.post(reverse("admin:mfa_recovery_codes"), {"password": "a-guess"})
    locked = member.post(reverse("admin:mfa_recovery_codes"), {"password": PASSWORD})
    assert b"Too many wrong passwords" in locked.content
    assert not LedgerEvent.objects.filter(kind="staff_user.mfa_recovery_codes_renewed").exists()
    assert _password_step(Client()).status_code == 429, "the login counts them too"


NEW_PASSWORD = "a-new-pw-for-alice-9"


def _own_password_change(member: Client, old: str):  # type: ignore[no-untyped-def]
    return member.post(
        reverse("admin:password_change"),
        {"old_password": old, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )


def test_changing_ones_own_password_counts_wrong_old_passwords_toward_the_lockout(
    alice: User, recovery_codes: list[str]
) -> None:
    # Django's own page checked the old password with no lockout: a stolen session could
    # guess it at leisure.
    member = _fully_logged_in(recovery_codes[0])
    refused = _own_password_change(member, "a-guess")
    assert b"not the account&#x27;s password" in refused.content
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _own_password_change(member, "a-guess")
    locked = _own_password_change(member, PASSWORD)
    assert b"Too many wrong passwords" in locked.content
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD), "not changed while locked out"
    assert not LedgerEvent.objects.filter(kind="staff_user.password_changed").exists()
    assert _password_step(Client()).status_code == 429, "the login counts them too"


def test_the_failed_login_records_keep_no_password_typed_on_a_staff_page(
    alice: User, recovery_codes: list[str]
) -> None:
    # A wrong old password is often the right one mistyped; the new one is the account's
    # password once the change goes through. Superusers read these records.
    member = _fully_logged_in(recovery_codes[0])
    _own_password_change(member, "a-guess-close-to-it")
    member.post(reverse("admin:mfa_recovery_codes"), {"password": "another-guess"})
    _own_password_change(member, PASSWORD)

    (attempt,) = AccessAttempt.objects.filter(username="alice")
    assert attempt.failures_since_start == 2
    assert "old_password=" in attempt.post_data  # the fields are named, their values not
    for typed in ("a-guess-close-to-it", "another-guess", NEW_PASSWORD, PASSWORD):
        assert typed not in attempt.post_data
    assert member.cookies["csrftoken"].value not in attempt.post_data


def test_the_migration_masks_the_passwords_records_kept_before() -> None:
    kept = AccessAttempt.objects.create(
        username="alice",
        ip_address="127.0.0.1",
        user_agent="x",
        get_data="",
        post_data="csrfmiddlewaretoken=tok\nold_password=mistyped\nnew_password1=Secret-1"
        "\nnew_password2=Secret-1\n---------\nold_password=again\nnext=/admin/",
        failures_since_start=2,
    )
    (path,) = (Path(settings.BASE_DIR) / "integrations" / "migrations").glob("0060_*.py")
    with connection.cursor() as cursor:
        cursor.execute(importlib.import_module(f"integrations.migrations.{path.stem}").MASK_SQL)

    kept.refresh_from_db()
    mask = "*" * 20
    assert kept.post_data == (
        f"csrfmiddlewaretoken={mask}\nold_password={mask}\nnew_password1={mask}"
        f"\nnew_password2={mask}\n---------\nold_password={mask}\nnext=/admin/"
    )


def test_ones_own_password_change_needs_the_old_one_and_ends_the_other_sessions(
    alice: User, recovery_codes: list[str]
) -> None:
    member = _fully_logged_in(recovery_codes[0])
    other = _fully_logged_in(recovery_codes[1])
    assert _own_password_change(member, "wrong").status_code == 200  # the form again
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)

    changed = _own_password_change(member, PASSWORD)
    assert changed["Location"] == reverse("admin:password_change_done")
    alice.refresh_from_db()
    assert alice.check_password(NEW_PASSWORD)
    assert member.get(INDEX).status_code == 200, "the session it was changed from stays"
    assert other.get(INDEX).status_code == 302, "every other session ended"
    (event,) = LedgerEvent.objects.filter(kind="staff_user.password_changed")
    assert (event.subject, event.actor, event.data) == (
        "alice",
        "staff:alice",
        {"sessions_ended": 1},
    )


def test_factors_enrolled_before_they_were_encrypted_are_named_on_the_dashboard(
    alice: User, recovery_codes: list[str]
) -> None:
    # With the app: new recovery codes would end a session verified by one of the old.
    member = _fully_logged_in(_code(StaffTotpDevice.objects.get(user=alice)))
    assert b"factors-once-in-clear" not in member.get(INDEX).content  # enrolled since

    # As if enrolled before the migration that encrypted the factors: it moved them then.
    applied = MigrationRecorder.Migration.objects.get(
        app="integrations", name__endswith="_staff_mfa_encrypted"
    ).applied
    earlier = applied - dt.timedelta(minutes=1)
    StaffTotpDevice.objects.filter(user=alice).update(created_at=earlier)
    StaffRecoveryCodes.objects.filter(user=alice).update(created_at=earlier)
    page = member.get(INDEX).content.decode()
    assert "Your authenticator app and recovery codes were set up before" in page
    assert reverse("admin:mfa_recovery_codes") in page
    assert "set up your authenticator app again" in page

    member.post(reverse("admin:mfa_recovery_codes"), {"password": PASSWORD})
    page = member.get(INDEX).content.decode()
    assert "Your authenticator app was set up before" in page  # the new codes are not named
    assert "new recovery codes</a>," not in page
    # Nobody else is told of alice's factors.
    bob = User.objects.create_user("bob", "bob@example.com", PASSWORD, is_staff=True)
    other = Client()
    other.force_login(bob)
    assert b"factors-once-in-clear" not in other.get(INDEX).content


# -- one's own account: no reset without the old password, no reset of one's own factor ---


def test_a_superuser_cannot_set_their_own_password_without_the_old_one(
    alice: User, recovery_codes: list[str]
) -> None:
    # A stolen superuser session would set a password of its own and end the owner's
    # sessions: the own account's page is the one that asks for the old password.
    thief = _fully_logged_in(recovery_codes[0])
    owner = _fully_logged_in(recovery_codes[1])
    own = reverse("admin:password_change")
    for page in (
        reverse("admin:auth_user_password_change", args=[alice.pk]),
        reverse("admin:auth_user_password_change", args=[f"00{alice.pk}"]),  # the same row
    ):
        assert thief.get(page)["Location"] == own
        sent = thief.post(
            page, {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"}
        )
        assert sent["Location"] == own

    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)
    assert owner.get(INDEX).status_code == 200, "the owner's session stays"
    assert not LedgerEvent.objects.filter(kind="staff_user.password_reset").exists()


def test_the_password_reset_record_refuses_ones_own_account(alice: User) -> None:
    with pytest.raises(ValidationError):
        staff_password_reset_record(user_id=alice.pk, actor="staff:alice", by=alice)
    assert not LedgerEvent.objects.filter(kind="staff_user.password_reset").exists()


def test_a_superuser_cannot_reset_their_own_second_factor(
    alice: User, recovery_codes: list[str]
) -> None:
    # A stolen session would keep itself, end the owner's, and enrol its own device.
    thief = _fully_logged_in(recovery_codes[0])
    owner = _fully_logged_in(recovery_codes[1])
    bob = User.objects.create_user("bob", password="pw-bob-123-long", is_staff=True)
    device = staff_mfa_pending_device(user=bob, session_key="bob")
    staff_mfa_enrol(
        user=bob, session_key="bob", token=_code(device), password="pw-bob-123-long", actor="t"
    )

    refused = thief.post(
        reverse("admin:auth_user_changelist"),
        {"action": "reset_mfa", "_selected_action": [alice.pk, bob.pk]},
        follow=True,
    )

    assert b"your own" in refused.content
    assert StaffTotpDevice.objects.filter(user=alice, confirmed=True).exists()
    assert StaffTotpDevice.objects.filter(user=bob, confirmed=True).exists(), "none reset"
    assert owner.get(INDEX).status_code == 200, "the owner's session stays"
    assert not LedgerEvent.objects.filter(kind="staff_user.mfa_reset").exists()
    with pytest.raises(ValidationError):
        staff_mfa_reset(user=alice, actor="staff:alice", by=alice)
    assert StaffTotpDevice.objects.filter(user=alice, confirmed=True).exists()
