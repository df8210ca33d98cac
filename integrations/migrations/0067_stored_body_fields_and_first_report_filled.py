"""0066's columns filled for the rows made before them, a batch of ids per transaction.

- A resolution request takes its broker's ``broker_id`` and ``mode`` as they are now: what
  its next attempt would have sent anyway, so no retry changes its body because of this.
- A work item DROP holds a status for takes ``reported_at`` as its ``first_reported_at``:
  the best there is, as the earlier times an amendment replaced were not kept. An item
  amended before this migration keeps counting to its amendment in the days to respond.

Not atomic, in batches: one UPDATE per table would hold every row it rewrote until it
committed, and a callback or delivery of any of them would wait that long (figures: the
upgrade section of docs/deployment.md). Each batch commits alone and fills only what is
still empty, so a migration cut short is simply run again.
A work item the old release reports after its batch (until the restart) keeps it empty: the
next file DROP takes for it, and the days to respond, take its reported_at instead.
"""

from typing import Any

from django.db import migrations

BATCH = 20_000

RESOLUTION_REQUESTS = """
UPDATE integrations_resolutionrequest r
   SET broker_id_code = b.broker_id, mode = b.mode
  FROM integrations_broker b
 WHERE b.id = r.broker_id AND r.id >= %(low)s AND r.id < %(high)s AND r.broker_id_code = ''
"""

WORK_ITEMS = """
UPDATE integrations_workitem
   SET first_reported_at = reported_at
 WHERE id >= %(low)s AND id < %(high)s
   AND first_reported_at IS NULL AND reported_at IS NOT NULL
"""


def _in_batches(schema_editor: Any, table: str, update: str) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT min(id), max(id) FROM {table}")  # noqa: S608
        first, last = cursor.fetchone()
        if first is None:
            return
        for low in range(first, last + 1, BATCH):
            # Outside a transaction (the migration is not atomic): each batch commits alone.
            cursor.execute(update, {"low": low, "high": low + BATCH})


def filled(apps: Any, schema_editor: Any) -> None:
    _in_batches(schema_editor, "integrations_resolutionrequest", RESOLUTION_REQUESTS)
    _in_batches(schema_editor, "integrations_workitem", WORK_ITEMS)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("integrations", "0066_stored_body_fields_and_first_report"),
    ]

    operations = [
        migrations.RunPython(filled, migrations.RunPython.noop),
    ]
