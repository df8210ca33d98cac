"""Install the API key lookup (with a callback's deletion request) as a SQL function
(``integrations/sql/api_key_lookup.sql``): one round trip with a cached plan for every API
call, the callbacks' hot path among them (docs/benchmarks.md, callbacks). Installs its own
frozen copy (``migrations/sql/0012/``)."""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).resolve().parent / "sql" / "0012" / "api_key_lookup.sql"


class Migration(migrations.Migration):
    dependencies = [("integrations", "0011_outcomes_and_settlement_in_sql")]

    operations = [
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql="DROP FUNCTION IF EXISTS dropportal_api_key_lookup(text, text, text);",
        )
    ]
