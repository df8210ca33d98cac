"""Each broker's recurring deletion counts as the worker last counted them, for the
dashboard (``services.cycle.recurring_counts``)."""

from __future__ import annotations

from django.db import models

from integrations.models.brokers import Broker

# The overview's counts, in its order: the fields both the worker's write and the
# dashboard's read name.
RECURRING_COUNTS = ("days", "due", "sent", "answered", "failing", "overdue")


class RecurringCounts(models.Model):
    """``selectors.recurring.RecurringOverview`` of one broker, as the worker's periodic job
    counted it: reading the whole schedule grows with every deleted consumer, and at a large
    broker's size takes longer than the dashboard may wait (docs/benchmarks.md). Only the
    dashboard reads it, and only while it is fresh (``RECURRING_COUNTS_FRESH``, today's DROP
    date, today's days setting); otherwise it counts live. Work items, not requests, as the
    overview counts them."""

    broker = models.OneToOneField(
        Broker, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    days = models.IntegerField()  # DROPPORTAL_RECURRING_DAYS when counted
    due = models.IntegerField()
    sent = models.IntegerField()
    answered = models.IntegerField()
    failing = models.IntegerField()
    overdue = models.IntegerField()
    # The DROP date the counts are of (what is due counts up to it), and the moment the
    # read began.
    counted_for = models.DateField()
    counted_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "recurring counts"

    def __str__(self) -> str:
        return f"recurring counts of broker {self.broker_id} for {self.counted_for}"
