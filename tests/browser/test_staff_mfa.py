"""A staff member's first login in a real browser, with MFA required (DATABASE_URL is set):
the password, then the guided enrolment (QR code, secret, the password again), then the
recovery codes, then in."""

from __future__ import annotations

from base64 import b32decode

import pytest
from django.contrib.auth.models import User
from django_otp.oath import TOTP
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from tests.browser.staff import PASSWORD, screenshot

pytestmark = pytest.mark.staff_mfa


def test_a_first_login_enrols_an_authenticator_app(
    page: Page, live_server: LiveServer, staff_user: User
) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(staff_user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    page.wait_for_url("**/admin/mfa/enrol/**")
    expect(page.locator(".dp-mfa-qr svg")).to_be_visible()
    secret = page.locator("#dp-mfa-secret").inner_text().strip()
    screenshot(page, "mfa-enrolment.png")
    code = TOTP(b32decode(secret)).token()
    page.get_by_label("Code from the app").fill(f"{code:06d}")
    page.get_by_label("Your password, again").fill(PASSWORD)
    page.get_by_role("button", name="Confirm and continue").click()

    expect(page.locator(".dp-recovery-codes li")).to_have_count(10)
    page.get_by_role("link", name="Continue").click()
    page.wait_for_url(f"{live_server.url}/admin/")
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
