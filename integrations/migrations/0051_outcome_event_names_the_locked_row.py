"""The outcome's ledger event names the request's state and outcome as the function found
them once it held the row's lock (frozen copy in ``migrations/sql/0051/``).

Before, they came from the copy the callback read before the lock: a second callback, or
the record of the dispatch's 2xx, that committed meanwhile was missing from the event
(``deleted`` recorded as following no outcome, after a ``failed``).
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0051" / "deletion_outcome_record.sql"
PREVIOUS_SQL = HERE / "sql" / "0032" / "deletion_outcome_record.sql"


class Migration(migrations.Migration):
    dependencies = [("integrations", "0050_ledger_refuses_truncate")]

    operations = [
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS_SQL.read_text(encoding="utf-8"),
        )
    ]
