"""Install the deletion outcome record taking the callback's optional details as one jsonb
argument and returning its verdict (a frozen copy in ``migrations/sql/0032/``): a new field
of a callback body is a key of ``p_details``, not a new parameter, and whether an answer is
an identical repeat (the same failure included) is decided in the SQL alone. The signature
and the result change, so the old function is dropped first: no overload is left behind.
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0032" / "deletion_outcome_record.sql"
PREVIOUS_SQL = HERE / "sql" / "0024" / "deletion_outcome_record.sql"

DROP_PREVIOUS = """
DROP FUNCTION dropportal_deletion_outcome_record(
    bigint, text, text, integer, text, timestamptz, text, text, text,
    text[], text[], text[], integer[], integer);
"""
DROP_THIS = """
DROP FUNCTION dropportal_deletion_outcome_record(
    bigint, text, text, integer, timestamptz, jsonb, text, text,
    text[], text[], text[], integer[], integer);
"""


class Migration(migrations.Migration):
    dependencies = [("integrations", "0031_unread_lists_rows_counted")]

    operations = [
        migrations.RunSQL(
            DROP_PREVIOUS + SQL.read_text(encoding="utf-8"),
            reverse_sql=DROP_THIS + PREVIOUS_SQL.read_text(encoding="utf-8"),
        )
    ]
