"""The automated DROP connection's outages, and what a long one obliges the broker to do.

An outage runs from the first DROP call that failed through no doing of the broker's (5xx,
timeouts, stalls; not a 401/403) after one DROP answered, to the next call DROP answers.
One that lasts more than a day is an obligation (11 CCR 7612(b)(1)): download by hand and
notify CalPrivacy in writing, through the DROP account, within 45 days of the failure. It
stays open until staff record the notice.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from integrations.drop_zone import drop_time_text
from integrations.models.fields import ACTOR_MAX_LENGTH


class DropOutageQuerySet(models.QuerySet["DropOutage"]):
    def ongoing(self) -> DropOutageQuerySet:
        return self.filter(ended_at__isnull=True)


class DropOutage(models.Model):
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    started_at = models.DateTimeField()  # the first failing call after DROP answered
    last_failure_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)  # the next call DROP answered
    failures = models.PositiveIntegerField(default=1)  # failed pulls and uploads in it
    last_error = models.TextField(blank=True, default="")

    objects = DropOutageQuerySet.as_manager()

    class Meta:
        verbose_name = "DROP outage"
        ordering = ["-started_at"]
        constraints = [
            # One ongoing outage per broker: a failure extends it, an answer ends it.
            models.UniqueConstraint(
                fields=["broker"],
                condition=models.Q(ended_at__isnull=True),
                name="drop_outage_one_ongoing",
            ),
        ]

    def __str__(self) -> str:
        # In DROP's zone, as staff read every time (the admin's, the messages').
        return f"{self.broker.broker_id} DROP outage from {drop_time_text(self.started_at)}"


class DropAccessObligationQuerySet(models.QuerySet["DropAccessObligation"]):
    def awaiting_notice(self) -> DropAccessObligationQuerySet:
        """Obligations whose written notice to CalPrivacy staff have not recorded."""
        return self.filter(notice_sent_on__isnull=True)


class DropAccessObligation(models.Model):
    """An outage that lasted more than a day: the notice owed, and once sent, its record."""

    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    outage = models.OneToOneField(DropOutage, on_delete=models.PROTECT, related_name="obligation")
    failure_started_at = models.DateTimeField()  # the outage's start
    due_date = models.DateField()  # 45 days after the failure, in DROP's calendar
    created_at = models.DateTimeField(db_default=Now())
    # The notice, as staff record it: the day it was sent, its reference (DROP's message
    # number, a letter's), who recorded it and when.
    notice_sent_on = models.DateField(null=True, blank=True)
    notice_reference = models.CharField(max_length=255, blank=True, default="")
    notice_recorded_by = models.CharField(max_length=ACTOR_MAX_LENGTH, blank=True, default="")
    notice_recorded_at = models.DateTimeField(null=True, blank=True)

    objects = DropAccessObligationQuerySet.as_manager()

    class Meta:
        verbose_name = "DROP access obligation"
        ordering = ["due_date", "pk"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(notice_sent_on__isnull=True) | ~models.Q(notice_reference=""),
                name="drop_access_notice_has_reference",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.broker.broker_id} notice to CalPrivacy due {self.due_date:%Y-%m-%d}"
