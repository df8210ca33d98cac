"""``staff list|deactivate``: who signed in how (password or the identity provider), their
roles and last sign-in; a deactivation stops the account and ends its sessions at once."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from devtools.oidc_provider import OidcProvider
from integrations.models import LedgerEvent, StaffTotpDevice
from tests.staff_idp import sign_in, staff_idp

pytestmark = pytest.mark.django_db

PASSWORD = "pw-root-123-long"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def idp(settings: Any) -> Iterator[OidcProvider]:
    with staff_idp(settings) as provider:
        yield provider


@pytest.fixture
def signed_in(idp: OidcProvider) -> tuple[Client, Client]:
    """ada signed in through the provider, root by password: each with a live session."""
    ada = Client()
    sign_in(ada, idp, "ada")
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    root = Client()
    root.post(reverse("admin:login"), {"username": "root", "password": PASSWORD})
    return ada, root


def test_list_says_who_signed_in_how(signed_in: tuple[Client, Client], idp: OidcProvider) -> None:
    User.objects.create_user("carl", password="pw-carl-123-long", is_staff=True)
    listed = json.loads(run("staff", "list", "--json"))["items"]
    by_name = {row["username"]: row for row in listed}
    assert set(by_name) == {"ada", "carl", "root"}
    assert by_name["ada"]["signs_in_with"] == "oidc"
    assert by_name["ada"]["last_method"] == "oidc"
    assert by_name["ada"]["roles"] == ["Operators"]
    assert by_name["ada"]["oidc_subject"] == idp.person("ada").subject
    assert by_name["root"]["signs_in_with"] == "password"
    assert by_name["root"]["last_method"] == "password"
    assert by_name["root"]["is_superuser"] is True
    assert by_name["carl"]["last_signed_in_at"] is None

    text = run("staff", "list")
    assert "ada  oidc  active  Operators  last signed in" in text and "by oidc" in text
    assert "carl  password  active  no role  never signed in" in text


def test_list_shows_the_last_sign_in_in_drops_calendar() -> None:
    User.objects.create_user(
        "carl",
        password="pw-carl-123-long",
        is_staff=True,
        # 03:00 UTC on July 2 is 20:00 on July 1 in California, where staff read times.
        last_login=dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC),
    )
    assert "carl  password  active  no role  last signed in 2026-07-01 20:00 PDT" in run(
        "staff", "list"
    )


def test_deactivate_ends_the_sessions_at_once_and_refuses_the_next_sign_in(
    signed_in: tuple[Client, Client], idp: OidcProvider
) -> None:
    ada, root = signed_in
    assert ada.get("/admin/").status_code == 200
    said = run("staff", "deactivate", "ada")
    assert "ada is deactivated" in said and "1 session(s) ended" in said
    assert ada.get("/admin/").status_code == 302, "the open session ended"
    assert root.get("/admin/").status_code == 200, "someone else's did not"
    assert sign_in(Client(), idp, "ada").status_code == 403
    (event,) = LedgerEvent.objects.filter(kind="staff_user.deactivated")
    assert (event.subject, event.data) == ("ada", {"sessions_ended": 1})
    assert event.actor.startswith("cli")
    assert "deactivated" in run("staff", "list")


def test_deactivate_refuses_an_unknown_or_already_deactivated_account(db: None) -> None:
    with pytest.raises(CommandError, match="no staff account 'nobody'"):
        run("staff", "deactivate", "nobody")
    User.objects.create_user("gone", is_staff=True, is_active=False)
    with pytest.raises(CommandError, match="gone is already deactivated"):
        run("staff", "deactivate", "gone")


def test_reset_mfa_on_the_command_line_is_how_a_superuser_gets_their_own_reset(
    signed_in: tuple[Client, Client],
) -> None:
    # The admin refuses a superuser's reset of their own factor: this is the way left.
    _, root = signed_in
    owner = User.objects.get(username="root")
    StaffTotpDevice.objects.create(user=owner, name="app", confirmed=True, seed="00" * 20)
    said = run("staff", "reset-mfa", "root")
    assert "root: 1 second factor(s) removed" in said
    assert not StaffTotpDevice.objects.filter(user=owner).exists()
    assert root.get("/admin/").status_code == 302, "every session ended, this one too"
    (event,) = LedgerEvent.objects.filter(kind="staff_user.mfa_reset")
    assert (event.subject, event.data["sessions_ended"]) == ("root", 1)
    assert event.actor.startswith("cli")
    with pytest.raises(CommandError, match="no staff account 'nobody'"):
        run("staff", "reset-mfa", "nobody")
