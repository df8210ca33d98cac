"""Mark each request with its round (0: the match's own; 1, 2...: a recurring deletion round)
and install the settlement that counts round 0 only (frozen copies in ``migrations/sql/0038/``):
a recurring round never changes the status DROP holds. The API key lookup returns the
answered request's round too, so a callback's ledger event says it is a recurring one without
another query; its result changes, so the old function is dropped first.
"""

from pathlib import Path

from django.db import migrations, models

HERE = Path(__file__).resolve().parent
SQL = HERE / "sql" / "0038" / "work_item_settle.sql"
PREVIOUS = HERE / "sql" / "0034" / "work_item_settle.sql"
LOOKUP = HERE / "sql" / "0038" / "api_key_lookup.sql"
PREVIOUS_LOOKUP = HERE / "sql" / "0030" / "api_key_lookup.sql"
DROP_LOOKUP = "DROP FUNCTION dropportal_api_key_lookup(text, text, text);\n"


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0037_service_providers_and_directives"),
    ]

    operations = [
        migrations.AddField(
            model_name="deletionrequest",
            name="round",
            field=models.PositiveSmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="resolutionrequest",
            name="round",
            field=models.PositiveSmallIntegerField(db_default=0, default=0),
        ),
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"),
            reverse_sql=PREVIOUS.read_text(encoding="utf-8"),
        ),
        migrations.RunSQL(
            DROP_LOOKUP + LOOKUP.read_text(encoding="utf-8"),
            reverse_sql=DROP_LOOKUP + PREVIOUS_LOOKUP.read_text(encoding="utf-8"),
        ),
    ]
