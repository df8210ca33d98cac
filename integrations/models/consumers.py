"""Consumers a broker registered: its pointer (``remote_identifier``) and identifier hashes.

Clear identifiers never reach the database: they are standardized and hashed on arrival.
Each hash is stored as the 32 raw bytes of the SHA-256 digest (``bytea``), not its 44-char
Base64 text: 33 bytes on disk instead of 45, byte comparison with no collation, so the
matching index is about a quarter smaller and the join compares fewer bytes. Base64 is
produced only at the edges (DROP files, dispatch bodies).

The three foreign keys here have no database constraint (``db_constraint=False``). A
constraint is checked by a per-row trigger that also locks the referenced row, a large
share of a big import on its own (docs/benchmarks.md, consumer import). The only writers,
the services of ``services.cycle.consumers`` (through ``integrations.consumers.load``), take
both ids from rows they join in the same statement, under a per-broker lock; deletes go
through the ORM, whose ``on_delete`` still applies. ``Consumer.broker`` has no index of
its own either: the unique constraint starts with it.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from integrations.models.drop import HASH_TYPE_CHOICES


class Consumer(models.Model):
    broker = models.ForeignKey(
        "integrations.Broker",
        on_delete=models.PROTECT,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    remote_identifier = models.CharField(max_length=255)
    remote_identifier_kind = models.CharField(max_length=64, default="external_id")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "remote_identifier"], name="consumer_unique_per_broker"
            )
        ]

    def __str__(self) -> str:
        return self.remote_identifier


class ConsumerHash(models.Model):
    """One identifier hash of a consumer (a consumer may have several of each list type)."""

    consumer = models.ForeignKey(
        Consumer, on_delete=models.CASCADE, related_name="hashes", db_constraint=False
    )
    # No index of its own: each broker's hashes are a partition of their own (migration 0026).
    broker = models.ForeignKey(
        "integrations.Broker",
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    hash_type = models.CharField(max_length=8, choices=HASH_TYPE_CHOICES)
    hash = models.BinaryField(max_length=32)

    class Meta:
        verbose_name_plural = "consumer hashes"
        constraints = [
            # Serves matching (broker, hash[, hash_type]) and keeps re-imports idempotent.
            # Led by hash: in a broker's partition, broker_id is the same on every row
            # (migration 0027).
            models.UniqueConstraint(
                fields=["hash", "hash_type", "consumer", "broker"], name="consumer_hash_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hash_type} hash of consumer {self.consumer_id}"
