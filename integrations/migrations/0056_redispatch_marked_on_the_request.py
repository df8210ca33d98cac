"""Whether a deletion request's last requeue was a redispatch is kept on the request
(``redispatched_at``), not read from the ledger by the callbacks (frozen copy of
``sql/deletion_outcome_record.sql`` in ``migrations/sql/0056/``).

The stale-failure rule of 0053 (a failure with no attempt since a redispatch answers the
dispatch before) looked for the request's latest ``deletion_request.redispatched`` or
``deletion_request.redelivery_requested`` event: state the request holds, read from the
ledger under the request's lock. A redispatch now sets ``redispatched_at`` and a redelivery
empties it, in the transaction that writes the event; the function reads it with the row it
locks.
"""

from pathlib import Path

from django.db import migrations, models

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0056" / "deletion_outcome_record.sql"
PREVIOUS_SQL = HERE / "sql" / "0053" / "deletion_outcome_record.sql"

# Every request whose latest event of the two kinds is a redispatch, marked when that event
# was written: what the redispatch would have set. All of them, not only those still
# awaiting it (attempts 0): only a requeue puts attempts back to 0, and each sets or
# empties the mark, so the others behave alike either way, and this way the mark says the
# same on every row. One pass over the two kinds through their partial index (0054). The
# column added above holds the requests' writes until this migration commits.
BACKFILL_SQL = """
UPDATE integrations_deletionrequest d
   SET redispatched_at = latest.created_at
  FROM (SELECT DISTINCT ON (e.subject) e.subject, e.kind, e.created_at
          FROM integrations_ledgerevent e
         WHERE e.kind IN ('deletion_request.redispatched',
                          'deletion_request.redelivery_requested')
         ORDER BY e.subject, e.id DESC) latest
 WHERE latest.kind = 'deletion_request.redispatched'
   AND d.request_uuid::text = latest.subject
"""


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0055_notifications_wait_for_the_file_being_sent"),
    ]

    operations = [
        migrations.AddField(
            model_name="deletionrequest",
            name="redispatched_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When it was last redispatched; empty when never, or redelivered since.",
                null=True,
            ),
        ),
        migrations.RunSQL(BACKFILL_SQL, reverse_sql=migrations.RunSQL.noop),
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS_SQL.read_text(encoding="utf-8"),
        ),
    ]
