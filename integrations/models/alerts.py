"""Alerts to staff: the state of each alert condition, so it alerts once when it starts and
once when it clears (``services/staff/alerts.py``)."""

from __future__ import annotations

from django.db import models


class AlertState(models.Model):
    # "<condition>:<what>", e.g. "integration_disabled:integration:<uuid>": one row per thing
    # a condition can be about, raised and cleared as often as it happens.
    key = models.CharField(max_length=255, unique=True)
    condition = models.CharField(max_length=64, db_index=True)
    broker_id = models.CharField(max_length=4, blank=True, default="")
    active = models.BooleanField(default=True)
    text = models.TextField()
    details = models.JSONField(default=dict, blank=True)
    raised_at = models.DateTimeField()
    cleared_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-raised_at"]
        indexes = [models.Index(fields=["condition", "active"], name="alert_condition_active")]

    def __str__(self) -> str:
        return f"{self.key} ({'active' if self.active else 'cleared'})"
