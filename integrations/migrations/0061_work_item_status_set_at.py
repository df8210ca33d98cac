"""When staff set a work item's status, so that only an outcome recorded after it replaces
it (a frozen copy of the settlement in ``migrations/sql/0061/``).

Before, once every request of the match was final, any settling again replaced a staff
status with the outcomes' code: a recurring round's answer undid a legal hold set on a
deleted item. A status set before this migration counts as set at the item's last change,
which is no earlier than when staff set it.
"""

from pathlib import Path

from django.db import migrations, models

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0061" / "work_item_settle.sql"
PREVIOUS = HERE / "sql" / "0059" / "work_item_settle.sql"

BACKFILL = """
UPDATE integrations_workitem SET status_set_at = updated_at WHERE status_reason <> ''
"""


class Migration(migrations.Migration):
    dependencies = [("integrations", "0060_failed_login_secrets_masked")]

    operations = [
        migrations.AddField(
            model_name="workitem",
            name="status_set_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS.read_text(encoding="utf-8"),
        ),
    ]
