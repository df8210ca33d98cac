"""``manage.py check`` (and every start-up) warns while the outbound filter is open."""

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
