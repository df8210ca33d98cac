"""Where the broker's systems are reached: webhook and ISI integrations, ISI connections,
and third-party SaaS deletion connections.

Both integration kinds hold a Webhook Secret (``whsec_…``): the service signs webhook
dispatches with it and the broker signs its callbacks with it. After a rotation the
previous secret stays valid until ``previous_secret_expires_at`` (24 hours).
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Self, TypeVar

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.functions import Now

from integrations.models.fields import EncryptedTextField


class IntegrationKind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    ISI = "isi", "ISI (broker's REST API)"


class IsiAuth(models.TextChoices):
    TOKEN = "token", "Static bearer token"
    OAUTH = "oauth", "OAuth 2.0 client credentials"


class Integration(models.Model):
    """A target of one of the ``IntegrationKind``s; each kind has its proxy model below."""

    KIND: ClassVar[str] = ""  # a kind's proxy model names its kind

    uuid = models.UUIDField(  # integration_id
        "UUID", default=uuid.uuid4, unique=True, editable=False
    )
    broker = models.ForeignKey(
        "integrations.Broker", on_delete=models.PROTECT, related_name="integrations"
    )
    kind = models.CharField(max_length=8, choices=IntegrationKind.choices)
    name = models.CharField(max_length=200)  # integration_name
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    # Disabled is paused: still a deletion target, its requests wait. Retired is gone for good
    # (services.staff.integrations.integration_retire): no new request, never enabled again.
    retired_at = models.DateTimeField(null=True, blank=True, editable=False)
    retired_reason = models.CharField(max_length=500, blank=True, default="", editable=False)
    webhook_secret = EncryptedTextField()
    previous_webhook_secret = EncryptedTextField(blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # webhook: where dispatches are POSTed
    url = models.URLField(max_length=500, blank=True, default="")
    # ISI: the broker's API and how to authenticate to it
    base_url = models.URLField(max_length=500, blank=True, default="")
    auth = models.CharField(max_length=8, choices=IsiAuth.choices, blank=True, default="")
    token = EncryptedTextField(blank=True, default="")
    token_url = models.URLField(max_length=500, blank=True, default="")
    client_id = models.CharField(max_length=200, blank=True, default="")
    client_secret = EncryptedTextField(blank=True, default="")
    access_token = EncryptedTextField(blank=True, default="")  # cached OAuth token
    access_token_expires_at = models.DateTimeField(null=True, blank=True)
    # When the token or client secret was last set or cleared: staff see this, never them.
    credentials_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    connections_refreshed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["broker", "name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=IntegrationKind.values), name="integration_kind_valid"
            ),
            models.CheckConstraint(
                condition=~models.Q(kind="webhook") | ~models.Q(url=""),
                name="webhook_integration_has_url",
            ),
            models.CheckConstraint(
                condition=~models.Q(kind="isi") | (~models.Q(base_url="") & ~models.Q(auth="")),
                name="isi_integration_has_base_url_and_auth",
            ),
            models.CheckConstraint(
                condition=models.Q(retired_at__isnull=True) | models.Q(enabled=False),
                name="integration_retired_stays_disabled",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.kind:
            self.kind = self.KIND  # a row made through a kind's proxy model is of that kind
        super().save(*args, **kwargs)

    @property
    def retired_refusal(self) -> str:
        """Why nothing is sent to it any more, once retired ("" while it is not)."""
        if self.retired_at is None:
            return ""
        return f"'{self.name}' was retired ({self.retired_reason}): nothing more is sent to it"


_Kind = TypeVar("_Kind", bound=Integration)


class OfItsKind(models.Manager[_Kind]):
    """A kind's proxy model's manager: the integrations of its ``KIND`` only."""

    def get_queryset(self) -> models.QuerySet[_Kind]:
        return super().get_queryset().filter(kind=self.model.KIND)


# One proxy model per kind: its own admin pages (``admin/<kind>.py``) and permissions.
class WebhookIntegration(Integration):
    KIND = IntegrationKind.WEBHOOK

    objects: ClassVar[OfItsKind[Self]] = OfItsKind()

    class Meta:
        proxy = True
        verbose_name = "webhook integration"


class IsiIntegration(Integration):
    KIND = IntegrationKind.ISI

    objects: ClassVar[OfItsKind[Self]] = OfItsKind()

    class Meta:
        proxy = True
        verbose_name = "ISI integration"


DROP_CAPABILITIES = ("privacy/drop/identifiers", "privacy/drop/delete")


class IsiConnection(models.Model):
    """A connection listed by the broker's ``/api/v1/connections/list``."""

    integration = models.ForeignKey(
        Integration, on_delete=models.CASCADE, related_name="connections"
    )
    uuid = models.UUIDField("UUID")
    capabilities = ArrayField(models.CharField(max_length=100), default=list)
    listed = models.BooleanField(default=True)  # false once the broker stops listing it
    refreshed_at = models.DateTimeField()

    class Meta:
        verbose_name = "ISI connection"
        constraints = [
            models.UniqueConstraint(fields=["integration", "uuid"], name="isi_connection_unique")
        ]

    def __str__(self) -> str:
        return str(self.uuid)

    @property
    def takes_part_in_drop(self) -> bool:
        return self.listed and all(c in self.capabilities for c in DROP_CAPABILITIES)

    @property
    def drop_exclusion(self) -> str:
        """Why it does not take part in DROP, for staff; ``""`` when it does."""
        missing = [c for c in DROP_CAPABILITIES if c not in self.capabilities]
        reasons = ["no longer listed by the broker"] if not self.listed else []
        if missing:
            reasons.append("lacks " + " and ".join(missing))
        return "; ".join(reasons)


class SaasConnection(models.Model):
    """A third-party SaaS deletion connector (generic HTTP), fed resolved clear identifiers."""

    # What staff name it by on the command line (``saas retire UUID``), as an integration's.
    # The database's default too: rows made without the ORM (and by code older than the
    # column, during an upgrade) get one of their own.
    uuid = models.UUIDField(
        "UUID", default=uuid.uuid4, db_default=RandomUUID(), unique=True, editable=False
    )
    broker = models.ForeignKey(
        "integrations.Broker", on_delete=models.PROTECT, related_name="saas_connections"
    )
    name = models.CharField(max_length=200)
    url = models.URLField(max_length=500)
    token = EncryptedTextField(blank=True, default="")
    token_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    identifier_categories = ArrayField(models.CharField(max_length=32), default=list)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    # As for integrations: disabled is paused (its deletions wait), retired is final.
    retired_at = models.DateTimeField(null=True, blank=True, editable=False)
    retired_reason = models.CharField(max_length=500, blank=True, default="", editable=False)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["broker", "name"]
        verbose_name = "SaaS connection"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(retired_at__isnull=True) | models.Q(enabled=False),
                name="saas_connection_retired_stays_disabled",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def retired_refusal(self) -> str:
        """Why nothing is sent to it any more, once retired ("" while it is not)."""
        if self.retired_at is None:
            return ""
        return f"'{self.name}' was retired ({self.retired_reason}): nothing more is sent to it"
