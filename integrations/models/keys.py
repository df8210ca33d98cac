"""API keys of the broker-facing API: only a SHA-256 digest and a visible prefix are kept."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models


class ApiKeyScope(models.TextChoices):
    WEBHOOK_CALLBACK = "webhook_callback", "Webhook callback"
    INGEST = "ingest", "Ingest consumers"
    AUDIT = "audit", "Audit (outcome history)"
    METRICS = "metrics", "Metrics (Prometheus scrape)"
    SUPPRESSION = "suppression", "Suppression check"
    DIRECTIVE_ACK = "directive_ack", "Directive acknowledgement (a service provider's own key)"


class ApiKeyQuerySet(models.QuerySet["ApiKey"]):
    def active(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiKey(models.Model):
    # None only for a metrics key that sees every broker's series (the operator's
    # Prometheus), which only a superuser creates; every other key belongs to one broker.
    broker = models.ForeignKey(
        "integrations.Broker",
        on_delete=models.PROTECT,
        related_name="+",
        null=True,
        blank=True,
    )
    # A directive_ack key is a service provider's own: it acknowledges that provider's
    # directives and nothing else.
    provider = models.ForeignKey(
        "integrations.ServiceProvider",
        on_delete=models.PROTECT,
        related_name="api_keys",
        null=True,
        blank=True,
    )
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    scopes = ArrayField(models.CharField(max_length=32, choices=ApiKeyScope.choices))
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(scopes__contained_by=ApiKeyScope.values) & ~models.Q(scopes=[]),
                name="api_key_scopes_known",
            ),
            models.CheckConstraint(
                condition=models.Q(broker__isnull=False) | models.Q(scopes=[ApiKeyScope.METRICS]),
                name="api_key_without_broker_metrics_only",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(provider__isnull=True)
                    & ~models.Q(scopes__contains=[ApiKeyScope.DIRECTIVE_ACK])
                )
                | models.Q(provider__isnull=False, scopes=[ApiKeyScope.DIRECTIVE_ACK]),
                name="api_key_directive_ack_bound_to_provider",
            ),
        ]
        # An audit key reads every outcome of its broker: minted by Auditors (and
        # superusers), not by whoever may add the broker's other keys.
        permissions = [("add_audit_apikey", "Can create API keys with the audit scope")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.broker.broker_id if self.broker else 'every broker'})"

    # DRF treats the authenticated principal as request.user.
    @property
    def is_authenticated(self) -> bool:
        return self.revoked_at is None

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
