"""Service providers and contractors of a broker, and the signed directives they get.

A SaaS connection deletes by itself (its deletions are the directive); every other service
provider or contractor is registered here and, after every match, gets a ``Directive``: the
DROP hashes of the consumers to delete as a CSV (``hash_type,hash``), signed with the
evidence key. The CSV's exact bytes are kept with their signature, so a directive checks
against its signature years later whatever has happened to the work items since.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from integrations.models.fields import ACTOR_MAX_LENGTH


class ServiceProvider(models.Model):
    broker = models.ForeignKey(
        "integrations.Broker", on_delete=models.PROTECT, related_name="service_providers"
    )
    name = models.CharField(max_length=200)
    contact = models.EmailField(max_length=254, blank=True, default="")
    # Where each directive is written (``s3://bucket/prefix/``); blank: downloaded from the admin.
    s3_prefix = models.CharField("S3 prefix", max_length=500, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["broker__broker_id", "name"]
        verbose_name = "service provider or contractor"
        verbose_name_plural = "service providers and contractors"
        constraints = [
            models.UniqueConstraint(fields=["broker", "name"], name="service_provider_name_unique")
        ]

    def __str__(self) -> str:
        return self.name


class DirectiveReason(models.TextChoices):
    MATCH = "match", "A DROP cycle matched"
    LATE_MATCH = "late_match", "Consumers registered later matched"
    RECURRING = "recurring", "A recurring deletion round"


class Directive(models.Model):
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    provider = models.ForeignKey(
        ServiceProvider, on_delete=models.PROTECT, related_name="directives"
    )
    reason = models.CharField(max_length=16, choices=DirectiveReason.choices)
    # The CSV exactly as signed: hashes only, never a clear identifier.
    content = models.BinaryField()
    sha256 = models.CharField("SHA-256", max_length=64)
    signature = models.TextField()  # Base64, one line: the ``.sig`` file's content
    key_fingerprint = models.CharField(max_length=64)
    rows = models.PositiveIntegerField()
    rows_by_hash_type = models.JSONField(default=dict)
    created_at = models.DateTimeField(db_default=Now())
    # Written to the provider's S3 prefix (the object's URI), or why it was not.
    s3_uri = models.CharField("S3 object", max_length=600, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_error = models.CharField(max_length=500, blank=True, default="")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    # A staff user (``admin:alice``, ``cli:alice``) or the provider's API key (``api:dpk_…``).
    acknowledged_by = models.CharField(max_length=ACTOR_MAX_LENGTH, blank=True, default="")
    acknowledgement_reference = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        # Recording a provider's answer is not changing the directive (nothing of it changes).
        permissions = [("acknowledge_directive", "Can record a directive's acknowledgement")]
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=models.Q(acknowledged_at__isnull=True),
                name="directive_unacknowledged",
            )
        ]

    def __str__(self) -> str:
        return f"directive {self.pk} to {self.provider}"

    @property
    def file_name(self) -> str:
        return f"directive-{self.broker.broker_id}-{self.pk}.csv"
