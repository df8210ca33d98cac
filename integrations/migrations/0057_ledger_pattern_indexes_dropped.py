"""The ledger's two ``varchar_pattern_ops`` indexes, on ``broker_id`` and on ``kind``, dropped.

Django makes one beside every indexed text column on PostgreSQL, for ``LIKE 'prefix%'``. No
query on the ledger filters by a prefix of either (the admin's search is ``UPPER(...) LIKE
'%...%'``, which no btree serves); the plain indexes on both stay. Every ledger event wrote
an entry in each, on the table every step of the cycle appends to. Dropping an index writes
no row: the ledger's append-only triggers (0002, 0050) do not apply. Django drops such an
index with ``IF EXISTS`` when it alters a column, so a later migration of these columns
still runs.
"""

from django.db import migrations

INDEXES = {
    "integrations_ledgerevent_broker_id_92747359_like": "broker_id",
    "integrations_ledgerevent_kind_a16f29ea_like": "kind",
}


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0056_redispatch_marked_on_the_request"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[f"DROP INDEX IF EXISTS {name}" for name in INDEXES],
            reverse_sql=[
                f"CREATE INDEX IF NOT EXISTS {name} ON integrations_ledgerevent "
                f"({column} varchar_pattern_ops)"
                for name, column in INDEXES.items()
            ],
        ),
    ]
