"""Install today's SQL functions (a frozen copy in ``migrations/sql/0013/``): the API key
lookup finds a callback's request by its unique key alone, a change made after 0012 that
databases migrated before it never received. The other files are installed again unchanged,
so this copy is the whole current set.
"""

from pathlib import Path

from django.db import migrations

SQL_DIR = Path(__file__).resolve().parent / "sql" / "0013"
FILES = (
    "ledger_append.sql",
    "work_item_settle.sql",
    "deletion_outcome_record.sql",
    "api_key_lookup.sql",
)
PREVIOUS = Path(__file__).resolve().parent / "sql" / "0012" / "api_key_lookup.sql"


class Migration(migrations.Migration):
    dependencies = [("integrations", "0012_api_key_lookup_in_sql")]

    operations = [
        migrations.RunSQL(
            "\n".join((SQL_DIR / name).read_text(encoding="utf-8") for name in FILES),
            # Back to 0012's lookup; the 0011 functions are unchanged in this copy.
            reverse_sql=PREVIOUS.read_text(encoding="utf-8"),
        )
    ]
