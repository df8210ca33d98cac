from django.db import migrations, models

# The requests sent again before the column existed, as the ledger names them (by their
# request UUID): their first send is their first attempt's.
MARK_REQUEUED = """
UPDATE integrations_deletionrequest SET requeued = true
 WHERE request_uuid::text IN (
       SELECT subject FROM integrations_ledgerevent
        WHERE kind IN ('deletion_request.redelivery_requested', 'deletion_request.redispatched'))
"""


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0062_actor_columns_as_wide_as_the_ledger"),
    ]

    operations = [
        migrations.AddField(
            model_name="deletionrequest",
            name="requeued",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Whether it was ever redelivered or redispatched.",
            ),
        ),
        migrations.RunSQL(MARK_REQUEUED, reverse_sql=migrations.RunSQL.noop),
    ]
