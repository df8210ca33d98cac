"""A failure answered while a redispatch waits to be sent is a repeat of the failure on
record, not a new outcome (frozen copy in ``migrations/sql/0053/``).

Before, it was recorded: the request went back to ``failed`` and its queued redispatch was
skipped, never sent, and an automatic one counted against the policy's tries all the same.
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0053" / "deletion_outcome_record.sql"
PREVIOUS_SQL = HERE / "sql" / "0051" / "deletion_outcome_record.sql"


class Migration(migrations.Migration):
    dependencies = [("integrations", "0052_outstanding_cycles")]

    operations = [
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS_SQL.read_text(encoding="utf-8"),
        )
    ]
