"""A DROP cycle's ``mode``: the broker's mode (DROP's sandbox or production) when the cycle
was downloaded, fixed then, so the yearly figures count production cycles only.

The column is added with a constant database default (``production``), which PostgreSQL
records without rewriting the table; the release before this one keeps making cycles
without naming it. The cycles made before it are then filled from their broker's mode as it
is now: the best there is, as the mode a broker had at each download was not kept (a broker
switched from test to production since has its sandbox cycles taken as production ones).
Only the cycles of brokers in test mode are rewritten, a batch of ids per transaction, as
0067 fills its columns: each batch commits alone and rewrites only what still differs, so a
migration cut short is simply run again. A cycle the old release downloads for a broker in
test mode after its batch (until the restart) takes ``production``: stop its worker's pulls
before migrating when a broker is in test mode.
"""

from typing import Any

from django.db import migrations, models

BATCH = 20_000

CYCLES = """
UPDATE integrations_dropcycle c
   SET mode = b.mode
  FROM integrations_broker b
 WHERE b.id = c.broker_id AND c.id >= %(low)s AND c.id < %(high)s AND c.mode <> b.mode
"""


def filled(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT min(id), max(id) FROM integrations_dropcycle")
        first, last = cursor.fetchone()
        if first is None:
            return
        for low in range(first, last + 1, BATCH):
            # Outside a transaction (the migration is not atomic): each batch commits alone.
            cursor.execute(CYCLES, {"low": low, "high": low + BATCH})


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("integrations", "0069_recurring_counts"),
    ]

    operations = [
        migrations.AddField(
            model_name="dropcycle",
            name="mode",
            field=models.CharField(
                choices=[("test", "Test (DROP sandbox)"), ("production", "Production")],
                db_default="production",
                max_length=10,
            ),
        ),
        migrations.RunPython(filled, migrations.RunPython.noop),
    ]
