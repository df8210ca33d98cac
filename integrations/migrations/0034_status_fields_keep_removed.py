"""Install the work item status rule taking the item's state before (a frozen copy in
``migrations/sql/0034/``): a removed item stays removed, owing nothing, in the one function
every write of a work item's state or amendment flag now goes through, instead of each
bulk update spelling that out around it. The signature changes, so the old function is
dropped first; the settlement is installed again calling the new one.
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0034" / "work_item_settle.sql"
PREVIOUS = HERE / "sql" / "0024" / "work_item_settle.sql"

DROP_PREVIOUS = """
DROP FUNCTION dropportal_work_item_status_fields(integer, timestamptz, integer, boolean);
"""
DROP_THIS = """
DROP FUNCTION dropportal_work_item_status_fields(
    text, integer, timestamptz, integer, boolean);
"""


class Migration(migrations.Migration):
    dependencies = [("integrations", "0033_integration_kind_proxies")]

    operations = [
        migrations.RunSQL(
            DROP_PREVIOUS + SQL.read_text(encoding="utf-8"),
            reverse_sql=DROP_THIS + PREVIOUS.read_text(encoding="utf-8"),
        )
    ]
