"""Two columns that keep what was true once, filled by 0067.

- A resolution request's ``broker_id_code`` and ``mode``, fixed when it is made, as a
  deletion request's are. The identifier retrieval notification (docs/contracts.md §2.3)
  read both from the broker on every attempt: a broker switched from test to production
  between two attempts changed ``mode`` across the retries of one ``webhook_request_id``.
- A work item's ``first_reported_at``: when DROP first held a status for it. ``reported_at``
  moves with every amendment DROP takes, so the days to respond (``drop metrics``) counted
  a status reported on day 2 and amended a year later as a year.

Each column is added without rewriting its table (a constant default, dropped at once), so
the table's lock is held for moments. The release before this one makes resolution requests
without the new columns, which have no default: stop its worker before migrating.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0065_deletion_request_broker_pages"),
    ]

    operations = [
        migrations.AddField(
            model_name="resolutionrequest",
            name="broker_id_code",
            field=models.CharField(default="", max_length=4, verbose_name="Broker ID"),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="resolutionrequest",
            name="mode",
            field=models.CharField(default="", max_length=10),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="workitem",
            name="first_reported_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
