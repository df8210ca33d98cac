"""Reappearances: a consumer registered again whose suppressed hash DROP had sent and the
broker had already matched (docs/contracts.md, the continuing duty).

Every hash DROP sent and did not remove is suppressed: the broker may not sell or share new
data about that consumer. When a registration (a file import, ``--replace``, the API) brings
a new consumer row whose hash matches a work item an earlier consumer had matched, the
late match dispatches it at once, and one ``Reappearance`` row per (work item, consumer)
says where it came from, so staff find the supplier that sells the broker deleted people
again (``drop reappearances``, the admin).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class Reappearance(models.Model):
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    work_item = models.ForeignKey(
        "integrations.WorkItem", on_delete=models.PROTECT, related_name="reappearances"
    )
    # The consumer may be forgotten later (its pointer stays here, as on deletion requests).
    consumer = models.ForeignKey(
        "integrations.Consumer", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    remote_identifier = models.CharField(max_length=255)
    # The registration's source as the ledger names it: "file:consumers.csv",
    # "s3://bucket/key" or "api".
    source = models.CharField(max_length=1024)
    # The file's SHA-256 when the source is one file; blank for the API and for an S3 prefix
    # of several files (each one's digest is in the registration's ledger event).
    source_sha256 = models.CharField("source SHA-256", max_length=64, blank=True, default="")
    api_key_prefix = models.CharField("API key prefix", max_length=16, blank=True, default="")
    reappeared_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-reappeared_at", "-id"]
        indexes = [models.Index(fields=["broker", "reappeared_at"], name="reappearance_broker_at")]

    def __str__(self) -> str:
        return f"{self.remote_identifier} reappeared ({self.source_label})"

    @property
    def source_label(self) -> str:
        return self.label_of(self.source, self.api_key_prefix)

    @staticmethod
    def label_of(source: str, api_key_prefix: str) -> str:
        """How staff name a source: the file, or the API key that sent it."""
        return f"api key {api_key_prefix}" if api_key_prefix else source
