"""DROP's notifications to a broker, one row per event: the unique event id is what makes a
notification DROP delivers again (a retry, a second delivery) do nothing the second time."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class DropNotification(models.Model):
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    event_id = models.CharField(max_length=200)  # X-Webhook-Event-Id: one logical event
    event_type = models.CharField(max_length=200)  # X-Webhook-Event-Type, as DROP sent it
    delivery_id = models.CharField(max_length=200, blank=True, default="")  # the first one
    sent_at = models.DateTimeField()  # X-Webhook-Timestamp
    received_at = models.DateTimeField(db_default=Now())
    message = models.TextField(blank=True, default="")
    # What the event is about, when the service can tell: DROP's body names nothing, so an
    # upload or amendment event goes to the broker's latest file of that kind sent to DROP.
    cycle = models.ForeignKey(
        "integrations.DropCycle",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="drop_notifications",
    )
    report_file = models.ForeignKey(
        "integrations.ReportFile",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="drop_notifications",
    )

    class Meta:
        ordering = ["-received_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "event_id"], name="drop_notification_event_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id}"
