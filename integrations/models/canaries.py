"""Canaries: consumers a broker keeps in its systems only so the deletion system can be tested.

Staff name a canary by the broker's own pointer (``remote_identifier``) of a consumer the
broker registered. Each ``CanaryRound`` (every imported DROP cycle, or ``drop canary`` at
once) sends each canary a deletion request to every deletion target, with ``drop_session_id``
"0" on the wire. A round is not a DROP cycle: it has no ``DropCycle`` and no work item, so
nothing of it is ever reported to DROP, owed, given a deadline or counted in DROP's figures.
Its requests point at the round (``DeletionRequest.canary_round``) instead of a work item.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from integrations.models.fields import ACTOR_MAX_LENGTH

# What a canary request carries on the wire as its DROP session: a numeric string, as the
# broker interface requires, that no DROP download ever has (they count from 1).
CANARY_SESSION_ID = "0"


class Canary(models.Model):
    broker = models.ForeignKey(
        "integrations.Broker", on_delete=models.PROTECT, related_name="canaries"
    )
    # A pointer, not a foreign key: the broker may forget the consumer (a full file without
    # it), and the canary stays named until staff remove it; a round then says it is gone.
    remote_identifier = models.CharField(max_length=255)
    added_by = models.CharField(max_length=ACTOR_MAX_LENGTH)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["broker", "remote_identifier"]
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "remote_identifier"], name="canary_unique_per_broker"
            )
        ]

    def __str__(self) -> str:
        return f"canary {self.remote_identifier}"


class CanaryRound(models.Model):
    """One test of the broker's deletion system: its canaries' requests, one per target."""

    broker = models.ForeignKey(
        "integrations.Broker", on_delete=models.PROTECT, related_name="canary_rounds"
    )
    # The DROP cycle whose import ran the round; none: run by hand (``drop canary``).
    cycle = models.ForeignKey(
        "integrations.DropCycle", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    started_at = models.DateTimeField()
    # Each request must be answered ``deleted`` by then (DROPPORTAL_CANARY_HOURS at the start).
    answer_by = models.DateTimeField()
    actor = models.CharField(max_length=ACTOR_MAX_LENGTH)
    # The canaries sent, and those named but not registered as a consumer with a hash when
    # the round ran (nothing could be sent for them: the round fails).
    canaries = models.JSONField(default=list)
    missing = models.JSONField(default=list, blank=True)
    targets = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-started_at", "-pk"]

    def __str__(self) -> str:
        return f"canary round {self.pk}"
