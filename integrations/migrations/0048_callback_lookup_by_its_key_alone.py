"""The API key lookup (``sql/api_key_lookup.sql``, a frozen copy in ``migrations/sql/0048/``)
finds a callback's request by its unique key alone and checks the kind of target it was
sent to outside that search. With both conditions in one search, a plan cached while the
table was nearly empty found a webhook request through the ``isi_connection_id`` index
(every webhook request is NULL there) and read more of the table with every request sent.
"""

from pathlib import Path

from django.db import migrations

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0048" / "api_key_lookup.sql"
PREVIOUS_SQL = HERE / "sql" / "0038" / "api_key_lookup.sql"


class Migration(migrations.Migration):
    dependencies = [("integrations", "0047_ledger_kinds_out_of_migrations")]

    operations = [
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS_SQL.read_text(encoding="utf-8"),
        )
    ]
