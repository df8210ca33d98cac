"""DROP's notifications to a broker, one row per event: the unique event id is what makes a
notification DROP delivers again (a retry, a second delivery) do nothing the second time, and
the unique signature what makes a captured notification sent again (under new, unsigned event
id and type headers) do nothing: the signature covers the timestamp and body only."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class DropNotification(models.Model):
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    # X-Webhook-Event-Id: one logical event ("" when DROP sent none).
    event_id = models.CharField(max_length=200, blank=True)
    event_type = models.CharField(max_length=200)  # X-Webhook-Event-Type, as DROP sent it
    delivery_id = models.CharField(max_length=200, blank=True, default="")  # the first one
    sent_at = models.DateTimeField()  # X-Webhook-Timestamp
    # X-Webhook-Signature, verified: one (timestamp, body) is taken once per broker. Outside
    # the 5 minutes its timestamp is refused anyway. "" on notifications kept before it was.
    signature = models.CharField(max_length=71, blank=True, default="")
    received_at = models.DateTimeField(db_default=Now())
    message = models.TextField(blank=True, default="")
    # What the event is about, when the service can tell: DROP's body names nothing, so an
    # upload or amendment event goes to the broker's latest file of that kind DROP accepted,
    # once no file of that kind is being sent (``awaiting_report_file`` until then).
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
    # The file was the latest of several of its kind one run uploaded: DROP's notification
    # names none, so which of them it is about is a guess.
    report_file_guessed = models.BooleanField(default=False)
    # It came while a file of its kind was being sent (``ReportFile.sending_since``): it may
    # be about that file, whose answer is not recorded yet, so it is attached (report_file,
    # cycle) in the transaction that records the last such answer.
    awaiting_report_file = models.BooleanField(default=False, db_default=False)

    class Meta:
        ordering = ["-received_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "event_id"],
                condition=~models.Q(event_id=""),
                name="drop_notification_event_unique",
            ),
            models.UniqueConstraint(
                fields=["broker", "signature"],
                condition=~models.Q(signature=""),
                name="drop_notification_signature_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id}"
