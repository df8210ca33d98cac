"""Make PostgreSQL refuse TRUNCATE on the ledger tables too, as it refuses UPDATE and DELETE.

Migration 0002 left TRUNCATE open for Django's test flush, which the suite no longer uses.
An owner can still drop the triggers (least privilege in production closes that, see
docs/operations.md), but a ``manage.py flush`` or a cleanup script run against the wrong
database now stops at the ledger instead of emptying it.
"""

from django.db import migrations

TABLES = ("integrations_ledgerevent", "integrations_ledgerchainlink", "integrations_ledgeranchor")


class Migration(migrations.Migration):
    dependencies = [("integrations", "0049_settled_statuses_stand")]

    operations = [
        migrations.RunSQL(
            "".join(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}"
                " FOR EACH STATEMENT EXECUTE FUNCTION dropportal_ledger_append_only();\n"
                for table in TABLES
            ),
            reverse_sql="".join(
                f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};\n" for table in TABLES
            ),
        )
    ]
