"""``manage.py check`` (and every start-up) warns while the outbound filter is open, and
while alert recipients are set with no mail server to send through."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

PRIVATE_TARGETS_OPEN = (
    "DROPPORTAL_ALLOW_PRIVATE_TARGETS is on: webhook, ISI, OAuth, SaaS and DROP calls may go "
    "to loopback and private addresses and over plain http."
)


@checks.register(checks.Tags.security)
def private_targets_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if not settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS:
        return []
    return [
        checks.Warning(
            PRIVATE_TARGETS_OPEN,
            hint="For development and tests only: unset it in production.",
            id="dropportal.W001",
        )
    ]


@checks.register()
def alert_emails_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if not settings.DROPPORTAL_ALERT_EMAILS_WITHOUT_MAIL_SERVER:
        return []
    return [
        checks.Warning(
            "DROPPORTAL_ALERT_EMAILS is set but EMAIL_URL is not: no alert is emailed.",
            hint="Set EMAIL_URL to the mail server alerts go through "
            "(smtp://USER:PASSWORD@HOST:587/?tls=True; smtp://localhost:25 for a local MTA).",
            id="dropportal.W003",
        )
    ]
