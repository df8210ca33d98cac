"""``make demo DEMO_ARGS=--sso``: the loopback identity provider is the admin's, and its people
sign in as the demo says (grace: Operators; alan: Auditors and Operators; eve: refused)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from devtools.demo import Narrator, identity_provider
from tests.staff_idp import sign_in

pytestmark = pytest.mark.django_db


def test_the_demos_identity_provider_signs_its_people_in(
    settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Whatever the demo sets goes when this test ends (the fixture restores the settings).
    settings.DROPPORTAL_OIDC_ISSUER = ""
    with identity_provider(Narrator(), settings.DROPPORTAL_PUBLIC_URL) as idp:
        assert idp.issuer == settings.DROPPORTAL_OIDC_ISSUER
        assert "Sign in with the loopback IdP" in capsys.readouterr().out
        assert sign_in(Client(), idp, "grace")["Location"] == "/admin/"
        assert sign_in(Client(), idp, "alan").status_code == 302
        assert sign_in(Client(), idp, "eve").status_code == 403
    roles = {
        user.username: sorted(user.groups.values_list("name", flat=True))
        for user in User.objects.filter(username__in=["grace", "alan"])
    }
    assert roles == {"grace": ["Operators"], "alan": ["Auditors", "Operators"]}
