"""The API key lookup (``sql/api_key_lookup.sql``, a frozen copy in ``migrations/sql/0030/``)
finds the deletion request a callback answers by the key its body names, no longer by the
kind of integration that dispatched it: the ISI callback by ``results_token`` (a request
sent to an ISI connection), the others by ``request_uuid`` (any other request). A new kind
of target whose broker calls back as a webhook's does then needs no SQL of its own.
"""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).resolve().parent / "sql" / "0030" / "api_key_lookup.sql"
PREVIOUS_SQL = Path(__file__).resolve().parent / "sql" / "0021" / "api_key_lookup.sql"


class Migration(migrations.Migration):
    dependencies = [("integrations", "0029_reported_means_drop_holds")]

    operations = [
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS_SQL.read_text(encoding="utf-8"),
        )
    ]
