"""Install the work item status rule as a table function of one row (a frozen copy in
``migrations/sql/0059/``), which the planner inlines into the statement that reads it: as a
record-returning function it was planned anew at every call, once per settlement and once
per row of the bulk updates. Its return type changes, so it is dropped first; the
settlement is installed again with it.
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0059" / "work_item_settle.sql"
PREVIOUS = HERE / "sql" / "0049" / "work_item_settle.sql"

DROP = """
DROP FUNCTION dropportal_work_item_status_fields(
    text, integer, timestamptz, integer, boolean);
"""


class Migration(migrations.Migration):
    dependencies = [("integrations", "0058_saas_connection_uuid")]

    operations = [
        migrations.RunSQL(
            DROP + SQL.read_text(encoding="utf-8"),
            reverse_sql=DROP + PREVIOUS.read_text(encoding="utf-8"),
        )
    ]
