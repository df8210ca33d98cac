"""Install the ledger append, the work item settlement and the deletion outcome record as
SQL functions (``integrations/sql/``): the callbacks' hot path in one statement, and every
ledger event hashed by one writer (docs/benchmarks.md, callbacks).

The SQL installed is this migration's own frozen copy (``migrations/sql/0011/``): a later
version is a new migration with a copy of its own, so every database ends with the same
functions however old it is.
"""

from pathlib import Path

from django.db import migrations

SQL_DIR = Path(__file__).resolve().parent / "sql" / "0011"
FILES = ("ledger_append.sql", "work_item_settle.sql", "deletion_outcome_record.sql")

DROP = """
DROP FUNCTION IF EXISTS dropportal_deletion_outcome_record(
    bigint, text, text, integer, text, timestamptz, text, text, text);
DROP FUNCTION IF EXISTS dropportal_work_item_settle(bigint, text);
DROP FUNCTION IF EXISTS dropportal_work_item_status_fields(integer, timestamptz, integer, boolean);
DROP FUNCTION IF EXISTS dropportal_ledger_append(timestamptz, text, text, text, text, text);
DROP FUNCTION IF EXISTS dropportal_ledger_event_hash(timestamptz, text, text, text, text, text);
"""


class Migration(migrations.Migration):
    dependencies = [("integrations", "0010_opt_out_record_for_resolutions")]

    operations = [
        migrations.RunSQL(
            "\n".join((SQL_DIR / name).read_text(encoding="utf-8") for name in FILES),
            reverse_sql=DROP,
        )
    ]
