"""A staff member signs in through the company's identity provider in a real browser: the
login page's "Sign in with …", the provider's own sign-in page (the loopback provider of
devtools/oidc_provider.py), back in the admin with the role of their group, and signing out
at the provider too. MFA is required (DATABASE_URL is set); the provider did it (amr)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from devtools.oidc_provider import OidcProvider
from tests.browser.staff import screenshot, staff_roles
from tests.staff_idp import staff_idp

pytestmark = pytest.mark.staff_mfa


@pytest.fixture
def idp(live_server: LiveServer, settings: Any, transactional_db: None) -> Iterator[OidcProvider]:
    staff_roles()  # a transactional test's flush emptied them
    with staff_idp(settings, public_url=live_server.url) as provider:
        yield provider


def test_signing_in_and_out_through_the_identity_provider(
    page: Page, live_server: LiveServer, idp: OidcProvider
) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    expect(page.get_by_label("Password")).to_be_visible()  # beside the password
    page.get_by_role("link", name="Sign in with Loopback IdP").click()

    page.wait_for_url(f"{idp.issuer}/authorize?**")
    page.get_by_label("Sign in as").select_option("ada")
    page.get_by_role("button", name="Sign in").click()

    page.wait_for_url(f"{live_server.url}/admin/")
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    screenshot(page, "oidc-signed-in.png")
    ada = User.objects.get(username="ada")
    assert list(ada.groups.values_list("name", flat=True)) == ["Operators"]

    page.evaluate("document.querySelector('form#logout-form').submit()")
    page.wait_for_url(f"{live_server.url}/admin/login/**")
    assert [ended["sub"] for ended in idp.ended_sessions] == [idp.person("ada").subject]
    page.goto(f"{live_server.url}/admin/")
    page.wait_for_url(f"{live_server.url}/admin/login/**")
