"""What the integration admin shows and calls for each kind of integration.

``IntegrationAdmin`` asks ``KindPages`` for its forms, fields, inlines and services instead
of branching on the kind: a new kind is one ``KindPages`` (next to its forms) and one entry
in ``admin.integrations.KIND_PAGES``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.http import HttpRequest

from integrations.admin.shown_once import SecretShownOnce
from integrations.models import Integration

# The add page's query parameter naming the kind ("Add ISI integration": ``?kind=isi``).
ADD_KIND_PARAMETER = "kind"


@dataclass(frozen=True)
class Created:
    """An integration just created, and its Webhook Secret (shown once)."""

    integration: Integration
    webhook_secret: str


@dataclass(frozen=True)
class KindPages:
    """One kind's add and change pages: forms, fields and the services they call."""

    label: str  # "Webhook", "ISI": the shown-once page's title
    add_form: type[forms.ModelForm]
    change_form: type[forms.ModelForm]
    add_fields: Sequence[Any]
    change_fields: Sequence[Any]
    readonly_fields: Sequence[Any]
    # create(request, form data, actor); may queue a message for staff.
    create: Callable[[HttpRequest, dict[str, Any], str], Created]
    # update(integration, form data, actor): one edit, one integration.updated event.
    update: Callable[[Integration, dict[str, Any], str], None]
    secret_shown_once: Callable[[Integration, str, str], SecretShownOnce]
    inlines: Sequence[Any] = field(default=())
