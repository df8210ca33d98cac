"""Two rules of the settlement (frozen copy in ``migrations/sql/0049/``).

Settling an item to the status it already has changes nothing. Before, it derived the state
and amendment flag again from the status DROP holds, so an amendment staff gave up came back
with the next outcome of the item, a recurring round's among them, and went to DROP again.

A request still open (a consumer matched later or come back) leaves a status DROP holds as
it is. Before, the next outcome of any request made the item open with no status, which
took it off the recurring schedule until the new request's answer: rounds stopped.
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0049" / "work_item_settle.sql"
PREVIOUS_SQL = HERE / "sql" / "0038" / "work_item_settle.sql"


class Migration(migrations.Migration):
    dependencies = [("integrations", "0048_callback_lookup_by_its_key_alone")]

    operations = [
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS_SQL.read_text(encoding="utf-8"),
        )
    ]
