"""The ledger: append-only events, sealed into a SHA-256 hash chain in batches.

Writers insert ``LedgerEvent`` rows (each carrying the SHA-256 of its own content, computed
by the database as it stores them: ``integrations/sql/ledger_append.sql``) without any
shared lock, so the ledger never serializes the service. A sealer
(``services.ledger.ledger_seal``) appends one ``LedgerChainLink`` per event, in batches:
``chain_hash = sha256(previous chain_hash : event id : event_hash)``. PostgreSQL refuses
UPDATE and DELETE on both tables (migration 0002). Those triggers are our own rather than
django-pgtrigger's: a pgtrigger trigger lets any session switch it off (``SET
pgtrigger.ignore``), ours only the table's owner. Every ``kind`` is a ``LedgerKind``
(integrations/ledger_kinds.py).

``txid`` is the writing transaction's id; the sealer uses it to know which events can no
longer appear "in the past" (see ``ledger_seal``).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Cast

from integrations.ledger_kinds import LedgerKind
from integrations.models.fields import ACTOR_MAX_LENGTH, LedgerKindField


class LedgerEvent(models.Model):
    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(db_index=True)
    broker_id = models.CharField("Broker ID", max_length=4, blank=True, default="", db_index=True)
    kind = LedgerKindField(max_length=64, db_index=True)
    subject = models.CharField(max_length=200, blank=True, default="")
    actor = models.CharField(max_length=ACTOR_MAX_LENGTH)
    data = models.JSONField(default=dict)
    event_hash = models.CharField(max_length=64)
    txid = models.BigIntegerField(
        db_default=Cast(
            Cast(models.Func(function="pg_current_xact_id"), models.TextField()),
            models.BigIntegerField(),
        ),
        db_index=True,
        editable=False,
    )

    class Meta:
        ordering = ["id"]
        indexes = [
            # A request's redispatches and redeliveries, by subject, not by scanning their
            # kind while redispatches pile up for good: the automatic policy's count
            # (selectors/requests.py automatic_redispatches, for each failed request) reads
            # them, and migration 0056 did once. The callbacks' stale-failure check reads the
            # request's own redispatched_at since 0056.
            models.Index(
                fields=["subject", "id"],
                condition=models.Q(
                    kind__in=[
                        LedgerKind.DELETION_REQUEST_REDISPATCHED,
                        LedgerKind.DELETION_REQUEST_REDELIVERY_REQUESTED,
                    ]
                ),
                name="ledger_redispatch_subject",
            )
        ]
        # Held by Auditors (and superusers): each export is an audit record of its own.
        permissions = [
            ("export_audit_records", "Can export the ledger, outcome history and evidence packs")
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.kind}"


class LedgerChainLink(models.Model):
    position = models.BigAutoField(primary_key=True)
    event = models.OneToOneField(
        LedgerEvent, on_delete=models.DO_NOTHING, db_constraint=False, related_name="chain_link"
    )
    chain_hash = models.CharField(max_length=64)
    sealed_at = models.DateTimeField()
    # The transaction horizon of the seal: every event written by a transaction older than
    # this was visible to the sealer, so it is in the chain by now.
    horizon_txid = models.BigIntegerField()

    class Meta:
        ordering = ["position"]

    def __str__(self) -> str:
        return f"link {self.position} (event {self.event_id})"


class LedgerAnchor(models.Model):
    """An RFC 3161 time-stamp token over the chain hash at one position: an outside
    authority's signed word that the chain had reached that hash by ``gen_time``, so the
    chain up to there cannot have been rewritten since. Append-only like the ledger
    (PostgreSQL refuses UPDATE and DELETE: migration 0040)."""

    id = models.BigAutoField(primary_key=True)
    position = models.BigIntegerField(db_index=True)
    event_id = models.BigIntegerField()  # the event at ``position``
    chain_hash = models.CharField(max_length=64)
    # The authority's TimeStampResp (DER) exactly as it came: ``openssl ts -verify`` reads it.
    token = models.BinaryField()
    token_sha256 = models.CharField(max_length=64)
    tsa_url = models.CharField("TSA URL", max_length=500)
    gen_time = models.DateTimeField()  # the time the authority put in the token
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return f"anchor of position {self.position}"
