"""Make PostgreSQL itself refuse UPDATE and DELETE on the ledger tables.

TRUNCATE is not trapped: Django's test flush needs it, and whoever may TRUNCATE owns the
table and could drop these triggers anyway. Least privilege in production (an application
role with INSERT and SELECT only on these tables) closes both, see docs/operations.md.
"""

from django.db import migrations

TABLES = ("integrations_ledgerevent", "integrations_ledgerchainlink")

FUNCTION = """
CREATE OR REPLACE FUNCTION dropportal_ledger_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
"""


def _triggers(table: str) -> str:
    return f"""
CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION dropportal_ledger_append_only();
"""


def _drop_triggers(table: str) -> str:
    return f"""
DROP TRIGGER IF EXISTS {table}_no_update_delete ON {table};
"""


class Migration(migrations.Migration):
    dependencies = [("integrations", "0001_initial")]

    operations = [
        migrations.RunSQL(
            FUNCTION + "".join(_triggers(t) for t in TABLES),
            reverse_sql="".join(_drop_triggers(t) for t in TABLES)
            + "DROP FUNCTION IF EXISTS dropportal_ledger_append_only();",
        )
    ]
