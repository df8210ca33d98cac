"""The company's identity provider on loopback (devtools/oidc_provider.py), set up as the
admin's OIDC provider, and the walk a browser makes through it::

    with staff_idp(settings) as idp:          # ada: privacy-ops (Operators), MFA done there
        response = sign_in(client, idp, "ada")  # bob: only in a group mapped to nothing
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import requests
from django.test import Client
from django.urls import reverse

from devtools.oidc_provider import OidcProvider

CLIENT_ID = "dropportal-staff"
CLIENT_SECRET = "idp-client-secret-9f2c"
ROLE_MAP = {"privacy-ops": "Operators", "privacy-auditors": "Auditors"}


@contextlib.contextmanager
def staff_idp(settings: Any, public_url: str | None = None) -> Iterator[OidcProvider]:
    """A provider whose client is the admin at ``public_url`` (the settings' own by default)."""
    public = public_url or settings.DROPPORTAL_PUBLIC_URL
    with OidcProvider(
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        redirect_uri=f"{public}/admin/oidc/callback/",
        post_logout_redirect_uri=f"{public}/admin/login/",
    ) as provider:
        settings.DROPPORTAL_PUBLIC_URL = public
        settings.DROPPORTAL_OIDC_ISSUER = provider.issuer
        settings.DROPPORTAL_OIDC_CLIENT_ID = CLIENT_ID
        settings.DROPPORTAL_OIDC_CLIENT_SECRET = CLIENT_SECRET
        settings.DROPPORTAL_OIDC_PROVIDER_NAME = "Loopback IdP"
        settings.DROPPORTAL_OIDC_ROLE_MAP = ROLE_MAP
        provider.add_person("ada", groups=["privacy-ops", "everyone"], amr=["pwd", "mfa"])
        provider.add_person("bob", groups=["everyone"])
        yield provider


def sign_in(client: Client, idp: OidcProvider, who: str, next_url: str = "/admin/") -> Any:
    """Our sign-in, the provider's authorization (over HTTP), back to our callback."""
    idp.signed_in = who
    start = client.get(reverse("admin:oidc_sign_in"), {"next": next_url})
    assert start.status_code == 302, start.content.decode()[:2000]
    assert start["Location"].startswith(f"{idp.issuer}/authorize?")
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302, at_provider.text
    back = urlsplit(at_provider.headers["Location"])
    return client.get(f"{back.path}?{back.query}")
