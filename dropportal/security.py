"""Start-up checks of the deployment's security settings.

``manage.py check`` (and so every start-up) refuses a plain-http public URL on a host other
than loopback while debug is off: staff passwords, MFA codes and session cookies would cross
the network in clear. ``DROPPORTAL_ALLOW_PRIVATE_TARGETS`` (a test or lab set-up) lets it
through; ``make run`` on http://127.0.0.1:8000 is loopback and never refused::

    DROPPORTAL_PUBLIC_URL=http://dp.example.com manage.py check   # dropportal.E001
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

from integrations.client_address import is_loopback_host


@checks.register(checks.Tags.security)
def public_url_uses_https(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    public = urlsplit(settings.DROPPORTAL_PUBLIC_URL)
    if public.scheme == "https" or settings.DEBUG or settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS:
        return []
    if is_loopback_host(public.hostname or ""):
        return []
    return [
        checks.Error(
            f"DROPPORTAL_PUBLIC_URL {settings.DROPPORTAL_PUBLIC_URL} is plain http on a host "
            "other than loopback: staff passwords, MFA codes and session cookies would cross "
            "the network in clear.",
            hint="Serve it over https (behind a TLS-terminating proxy, also set "
            "DROPPORTAL_BEHIND_TLS_PROXY=true), or set DROPPORTAL_ALLOW_PRIVATE_TARGETS=true "
            "for a closed test set-up.",
            id="dropportal.E001",
        )
    ]
