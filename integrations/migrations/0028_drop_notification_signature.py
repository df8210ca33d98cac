"""DROP's notifications keep their verified signature, each unique per broker: a captured
notification sent again under new (unsigned) event id and type headers is a duplicate. An
event id is unique when DROP sent one; a notification without one is recorded all the same.
A notification attached to the latest of several files one run uploaded says it is a guess.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0027_consumer_hash_keys_lead_with_hash_and_id"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="dropnotification",
            name="drop_notification_event_unique",
        ),
        migrations.AddField(
            model_name="dropnotification",
            name="report_file_guessed",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="dropnotification",
            name="signature",
            field=models.CharField(blank=True, default="", max_length=71),
        ),
        migrations.AlterField(
            model_name="dropnotification",
            name="event_id",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddConstraint(
            model_name="dropnotification",
            constraint=models.UniqueConstraint(
                condition=models.Q(("event_id", ""), _negated=True),
                fields=("broker", "event_id"),
                name="drop_notification_event_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="dropnotification",
            constraint=models.UniqueConstraint(
                condition=models.Q(("signature", ""), _negated=True),
                fields=("broker", "signature"),
                name="drop_notification_signature_unique",
            ),
        ),
    ]
