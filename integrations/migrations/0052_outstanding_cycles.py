"""Which cycles may have outstanding work items, kept by the database, so that no index of
the work items needs their state (frozen copy of ``sql/outstanding_cycles.sql`` in
``migrations/sql/0052/``).

``work_item_cycle_state`` (cycle, state) answered "has this cycle a work item in state X",
but it made every change of state a new entry in each of the table's indexes: marking a
reported cycle's million rows rewrote all five. ``OutstandingCycle`` now answers which
cycles to ask at all (triggers on the work items mark a cycle, a periodic job clears it),
the index goes, and the work items leave two fifths of each page free so that a change of state
writes the row's new version on its own page: a HOT update, no index touched
(docs/benchmarks.md, "Reporting a cycle"). The fill factor applies to pages written from
now on; existing rows move as they are next updated.
"""

from pathlib import Path

import django.db.models.deletion
from django.db import migrations, models

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0052" / "outstanding_cycles.sql"

DROP_SQL = """
DROP TRIGGER IF EXISTS integrations_workitem_outstanding_inserted ON integrations_workitem;
DROP TRIGGER IF EXISTS integrations_workitem_outstanding_updated ON integrations_workitem;
DROP FUNCTION IF EXISTS dropportal_outstanding_cycles_inserted();
DROP FUNCTION IF EXISTS dropportal_outstanding_cycle_updated();
DROP FUNCTION IF EXISTS dropportal_outstanding_cycle_mark(bigint);
"""

# Every cycle with an outstanding item today: one probe of the (cycle, state) index per
# cycle while it still answers. CREATE TRIGGER above holds the work items' writes until this
# migration commits, so the whole index is not read.
BACKFILL_SQL = """
INSERT INTO integrations_outstandingcycle (cycle_id)
SELECT c.id FROM integrations_dropcycle c
 WHERE EXISTS (SELECT 1 FROM integrations_workitem w
                WHERE w.cycle_id = c.id AND w.state IN ('open', 'reportable'))
"""


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0051_outcome_event_names_the_locked_row"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutstandingCycle",
            fields=[
                (
                    "cycle",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="integrations.dropcycle",
                    ),
                ),
            ],
        ),
        migrations.RunSQL(SQL.read_text(encoding="utf-8"), reverse_sql=DROP_SQL),
        migrations.RunSQL(BACKFILL_SQL, reverse_sql=migrations.RunSQL.noop),
        migrations.RemoveIndex(
            model_name="workitem",
            name="work_item_cycle_state",
        ),
        # Two fifths of each page free: the row's next version fits beside it. 50 reports
        # faster and 70 reads a never-reported cycle faster; 60 keeps both targets with
        # room (docs/benchmarks.md, reporting).
        migrations.RunSQL(
            "ALTER TABLE integrations_workitem SET (fillfactor = 60)",
            reverse_sql="ALTER TABLE integrations_workitem RESET (fillfactor)",
        ),
    ]
