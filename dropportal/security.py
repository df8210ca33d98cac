"""Start-up checks of the deployment's security settings.

``manage.py check`` (and so every start-up) refuses a plain-http public URL on a host other
than loopback while debug is off: staff passwords, MFA codes and session cookies would cross
the network in clear. Only ``DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL`` (a closed lab) lets it
through, and every check and start says so in a warning (``dropportal.W002``) while it is on;
``DROPPORTAL_ALLOW_PRIVATE_TARGETS`` opens outbound calls, not this. ``make run`` on
http://127.0.0.1:8000 is loopback and never refused. Debug mode off loopback is refused
whatever the scheme (``dropportal.E005``)::

    DROPPORTAL_PUBLIC_URL=http://dp.example.com manage.py check   # dropportal.E001
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

from integrations.client_address import is_loopback_host

PLAIN_HTTP_PUBLIC_URL_ALLOWED = (
    "DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL is on: a plain-http DROPPORTAL_PUBLIC_URL off "
    "loopback is allowed, so staff passwords, MFA codes and session cookies may cross the "
    "network in clear."
)


@checks.register(checks.Tags.security)
def public_url_uses_https(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if settings.DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL:
        return [
            checks.Warning(
                PLAIN_HTTP_PUBLIC_URL_ALLOWED,
                hint="For a closed test set-up only: unset it and serve over https.",
                id="dropportal.W002",
            )
        ]
    public = urlsplit(settings.DROPPORTAL_PUBLIC_URL)
    if public.scheme == "https" or settings.DEBUG:
        return []
    if is_loopback_host(public.hostname or ""):
        return []
    return [
        checks.Error(
            f"DROPPORTAL_PUBLIC_URL {settings.DROPPORTAL_PUBLIC_URL} is plain http on a host "
            "other than loopback: staff passwords, MFA codes and session cookies would cross "
            "the network in clear.",
            hint="Serve it over https (behind a TLS-terminating proxy, also set "
            "DROPPORTAL_BEHIND_TLS_PROXY=true), or set "
            "DROPPORTAL_ALLOW_PLAIN_HTTP_PUBLIC_URL=true for a closed test set-up.",
            id="dropportal.E001",
        )
    ]


@checks.register(checks.Tags.security)
def no_debug_off_loopback(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Debug mode serves a public URL off loopback: refused. Its error pages show whoever
    causes an error the settings (an alert webhook's URL is its own secret), the request's
    body (a password, a credential being set) and the environment, and it turns the https
    check above off."""
    public = urlsplit(settings.DROPPORTAL_PUBLIC_URL)
    if not settings.DEBUG or is_loopback_host(public.hostname or ""):
        return []
    return [
        checks.Error(
            f"DJANGO_DEBUG is on while DROPPORTAL_PUBLIC_URL {settings.DROPPORTAL_PUBLIC_URL} "
            "is off loopback: Django's debug pages would show settings, request bodies and "
            "the environment to whoever causes an error.",
            hint="Unset DJANGO_DEBUG (debug mode is for a set-up on 127.0.0.1).",
            id="dropportal.E005",
        )
    ]


@checks.register(checks.Tags.security)
def oidc_role_map_names_our_roles(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every role DROPPORTAL_OIDC_ROLE_MAP grants is one of ours (a typo would otherwise
    refuse everyone of that group at sign-in, or silently grant nothing), the issuer is
    https (but on loopback), and an issuer comes with a map."""
    from integrations.services.staff.staff import STAFF_ROLES

    unknown = sorted(
        {role for role in settings.DROPPORTAL_OIDC_ROLE_MAP.values() if role not in STAFF_ROLES}
    )
    errors: list[checks.CheckMessage] = []
    if unknown:
        errors.append(
            checks.Error(
                f"DROPPORTAL_OIDC_ROLE_MAP grants {', '.join(repr(r) for r in unknown)}, which "
                f"is not a role here (the roles: {', '.join(STAFF_ROLES)}).",
                hint="Write it as idp-group=Role,idp-group=Role with the roles' exact names.",
                id="dropportal.E002",
            )
        )
    issuer = urlsplit(settings.DROPPORTAL_OIDC_ISSUER)
    if issuer.scheme and issuer.scheme != "https" and not is_loopback_host(issuer.hostname or ""):
        errors.append(
            checks.Error(
                f"DROPPORTAL_OIDC_ISSUER {settings.DROPPORTAL_OIDC_ISSUER} is not https: the "
                "provider's keys and tokens would cross the network in clear.",
                hint="Use the provider's https issuer URL (its discovery document's issuer).",
                id="dropportal.E004",
            )
        )
    if settings.DROPPORTAL_OIDC_ISSUER and not settings.DROPPORTAL_OIDC_ROLE_MAP:
        errors.append(
            checks.Error(
                "DROPPORTAL_OIDC_ISSUER is set but DROPPORTAL_OIDC_ROLE_MAP is empty: every "
                "sign-in through the identity provider would be refused.",
                hint="Map the provider's groups to roles: privacy-ops=Operators,...",
                id="dropportal.E003",
            )
        )
    return errors
