"""Each broker's recurring deletion counts, as the worker counts them every 5 minutes for the
dashboard (``RecurringCounts``): reading the whole schedule live grows with every deleted
consumer, past what the dashboard may wait. A new, empty table: the dashboard counts live until the
worker's first run."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0068_free_text_masked_again"),
    ]

    operations = [
        migrations.CreateModel(
            name="RecurringCounts",
            fields=[
                (
                    "broker",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="integrations.broker",
                    ),
                ),
                ("days", models.IntegerField()),
                ("due", models.IntegerField()),
                ("sent", models.IntegerField()),
                ("answered", models.IntegerField()),
                ("failing", models.IntegerField()),
                ("overdue", models.IntegerField()),
                ("counted_for", models.DateField()),
                ("counted_at", models.DateTimeField()),
            ],
            options={
                "verbose_name_plural": "recurring counts",
            },
        ),
    ]
