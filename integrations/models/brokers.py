"""Registered data brokers: the 4-digit DROP registration number, how to reach DROP, and
the lists staff recorded the broker selected in DROP's portal."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models.constraints import BaseConstraint
from django.db.models.functions import Now

from integrations.list_types import DATA_TYPE_OF, LABELS
from integrations.models.fields import ACTOR_MAX_LENGTH, EncryptedTextField

broker_id_validator = RegexValidator(
    r"^[0-9]{4}\Z", "A DROP data broker id is exactly four digits, such as 4821."
)


def within_download_cadence(days: int) -> None:
    """A pull interval must keep the broker within DROP's download cadence (45 days): a
    pull runs within the hour after it is due and takes its own time, so the cadence itself
    would be late (``selectors.pulls`` holds a stored one to a day less, too)."""
    cadence = settings.DROPPORTAL_DOWNLOAD_CADENCE_DAYS
    if days >= cadence:
        raise ValidationError(
            f"DROP requires a download at least every {cadence} days, and a pull comes up to "
            f"an hour after it is due; choose {cadence - 1} or fewer."
        )


class BrokerMode(models.TextChoices):
    TEST = "test", "Test (DROP sandbox)"
    PRODUCTION = "production", "Production"


class Broker(models.Model):
    broker_id = models.CharField(
        "DROP broker id", max_length=4, unique=True, validators=[broker_id_validator]
    )
    name = models.CharField(max_length=200)
    mode = models.CharField(max_length=10, choices=BrokerMode.choices, default=BrokerMode.TEST)
    drop_api_key = EncryptedTextField(
        "DROP API key", blank=True, default="", help_text="Stored encrypted; sent as X-API-KEY."
    )
    drop_base_url = models.URLField(
        "DROP base URL",
        blank=True,
        default="",
        help_text="Leave empty to use DROP's URL for the mode (or DROP_API_URL).",
    )
    # When the key was last set or cleared: staff see this, never the key.
    drop_api_key_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The signing secret DROP's portal shows for the broker's notification webhook.
    drop_webhook_secret = EncryptedTextField(
        "DROP webhook secret",
        blank=True,
        default="",
        help_text="Stored encrypted; checks the signature of DROP's notifications.",
    )
    drop_webhook_secret_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The periodic pull (integrations.tasks.pull_due_brokers) downloads when one is due.
    auto_pull = models.BooleanField(
        "pull automatically",
        default=False,
        db_default=False,
        help_text="Download, import and match DROP's lists every 'pull interval' days.",
    )
    pull_interval_days = models.PositiveSmallIntegerField(
        "pull interval (days)",
        default=30,
        db_default=30,
        validators=[MinValueValidator(1), within_download_cadence],
        help_text="DROP requires a download at least every 45 days.",
    )
    # Each response file waits for a second person before DROP gets it (services.reporting.
    # report_approval).
    approve_uploads = models.BooleanField(
        "approve uploads",
        default=False,
        db_default=False,
        help_text="Every response file (upload or amendment) waits until an Operator other "
        "than whoever wrote it approves it; only then is it uploaded to DROP.",
    )
    last_pulled_at = models.DateTimeField(
        "last pulled", null=True, blank=True, editable=False
    )  # the last pull DROP answered with a package or "nothing new"
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["broker_id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(broker_id__regex=r"^[0-9]{4}$"), name="broker_id_four_digits"
            ),
            models.CheckConstraint(
                condition=models.Q(mode__in=BrokerMode.values), name="broker_mode_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(pull_interval_days__gte=1), name="broker_pull_interval_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.broker_id} {self.name}"

    def get_constraints(self) -> list[tuple[type[models.Model], Sequence[BaseConstraint]]]:
        """The constraints Django tests before a save (``full_clean``, the admin's form):
        not those that repeat a field validator it runs anyway, which Django would test
        again with a query each. The database still enforces them."""
        return [
            (model, [c for c in constraints if c.name not in _REPEATING_FIELD_VALIDATORS])
            for model, constraints in super().get_constraints()
        ]


# Broker's check constraints each repeat a field validator: broker_id_validator, the mode's
# choices, the pull interval's minimum.
_REPEATING_FIELD_VALIDATORS = {
    "broker_id_four_digits",
    "broker_mode_valid",
    "broker_pull_interval_positive",
}


class ListSelection(models.Model):
    """Which DROP lists staff say the broker selected in DROP's portal, from when, and why.

    A row per selection, never changed: the one in force at a time is the latest
    ``effective_from`` at or before it (``selectors.list_selection``). DROP's portal keeps
    the selection; dropportal cannot read it, so this is what staff recorded, each with its
    ledger event (``broker.lists_selected``).
    """

    broker = models.ForeignKey(Broker, on_delete=models.PROTECT, related_name="list_selections")
    # hash_types (integrations/list_types.py), in its order.
    lists = ArrayField(models.CharField(max_length=8, choices=list(LABELS.items())))
    reason = models.TextField()
    actor = models.CharField(max_length=ACTOR_MAX_LENGTH)
    effective_from = models.DateTimeField()
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["broker", "-effective_from", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(lists__len__gte=1), name="list_selection_not_empty"
            ),
            models.CheckConstraint(
                condition=~models.Q(reason=""), name="list_selection_reason_given"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.broker.broker_id}: {', '.join(DATA_TYPE_OF[t] for t in self.lists)}"
