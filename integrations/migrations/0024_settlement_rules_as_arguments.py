"""Install the work item settlement and the deletion outcome record taking their rules as
arguments (a frozen copy in ``migrations/sql/0024/``): which outcomes are final, which code
each reports and which wins, and which requests take an outcome are passed in from Python
(``integrations/models/requests.py``) instead of being spelled out in the SQL, so each rule
has one home. The signatures change, so the old functions are dropped first.
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL_DIR = HERE / "sql" / "0024"
PREVIOUS_DIR = HERE / "sql" / "0013"
FILES = ("work_item_settle.sql", "deletion_outcome_record.sql")

DROP_PREVIOUS = """
DROP FUNCTION dropportal_deletion_outcome_record(
    bigint, text, text, integer, text, timestamptz, text, text, text);
DROP FUNCTION dropportal_work_item_settle(bigint, text);
"""
DROP_THESE = """
DROP FUNCTION dropportal_deletion_outcome_record(
    bigint, text, text, integer, text, timestamptz, text, text, text,
    text[], text[], text[], integer[], integer);
DROP FUNCTION dropportal_work_item_settle(bigint, text, text[], integer[], integer);
"""


def _read(directory: Path) -> str:
    return "\n".join((directory / name).read_text(encoding="utf-8") for name in FILES)


class Migration(migrations.Migration):
    dependencies = [("integrations", "0023_console_labels")]

    operations = [
        migrations.RunSQL(
            DROP_PREVIOUS + _read(SQL_DIR),
            reverse_sql=DROP_THESE + _read(PREVIOUS_DIR),
        )
    ]
