"""Staff in the browser tests: users with a known password, logging in, screenshots."""

from __future__ import annotations

import importlib
import pkgutil
import time
from pathlib import Path
from urllib.parse import urlsplit

from django.apps import apps as django_apps
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from integrations import migrations as migrations_package

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PASSWORD = "correct-horse-battery"


def staff_roles() -> None:
    """The groups of migration 0005 again, with what later migrations gave them: a
    transactional test's flush empties auth_group."""
    migration = importlib.import_module("integrations.migrations.0005_staff_roles")
    migration.create_roles(django_apps, None)
    # Found by its name, not its number (which may change when branches are merged).
    (auditors,) = (
        module.name
        for module in pkgutil.iter_modules(migrations_package.__path__)
        if module.name.endswith("_roles_and_metrics_keys")
    )
    importlib.import_module(f"integrations.migrations.{auditors}").grant_auditors(django_apps, None)


def make_staff(username: str, *groups: str, superuser: bool = False) -> User:
    if groups:
        staff_roles()
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD)
    user.is_staff = True
    user.is_superuser = superuser
    user.save()
    user.groups.set(Group.objects.filter(name__in=groups))
    assert user.groups.count() == len(groups), f"no group named {groups}"
    return user


def log_in(page: Page, live_server: LiveServer, username: str) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/admin/")


def sign_in(page: Page, live_server: LiveServer, username: str, path: str = "/admin/") -> None:
    """Open ``path`` signed in as ``username`` without the login form's pages: the session is
    made on the server as the form's login makes it (no ``staff_user.signed_in`` event), and
    its cookie given to the browser as Django sets it. Tests of signing in use ``log_in``."""
    client = Client()
    # The backend the form's password signs in with (django-axes's, listed first, only refuses).
    client.force_login(
        User.objects.get(username=username), backend="django.contrib.auth.backends.ModelBackend"
    )
    name = settings.SESSION_COOKIE_NAME
    page.context.add_cookies(
        [
            {
                "name": name,
                "value": client.cookies[name].value,
                "domain": settings.SESSION_COOKIE_DOMAIN or str(urlsplit(live_server.url).hostname),
                "path": settings.SESSION_COOKIE_PATH,
                "expires": time.time() + settings.SESSION_COOKIE_AGE,
                "httpOnly": settings.SESSION_COOKIE_HTTPONLY,
                "secure": settings.SESSION_COOKIE_SECURE,
                "sameSite": settings.SESSION_COOKIE_SAMESITE or None,
            }
        ]
    )
    page.goto(f"{live_server.url}{path}")
    expect(page).to_have_url(f"{live_server.url}{path}")  # not sent to the login page


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path
