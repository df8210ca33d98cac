"""The consumer hashes' unique key leads with ``hash``, their primary key with ``id``.

Each is a partitioned index, and every row of a broker's partition has the same
``broker_id``: as the leading column it decided no comparison, and every comparison of an
index build went on to the next column. Led by ``hash`` and by ``id``, a broker's first
load builds the two in well under half the time (docs/benchmarks.md). Lookups are as
before: every query names the broker (one partition) and the hash, or the id. Both keys
are built again on every partition: on a large set, this migration takes minutes.
"""

from django.db import migrations, models

FORWARD = """
ALTER TABLE integrations_consumerhash DROP CONSTRAINT consumer_hash_unique;
ALTER TABLE integrations_consumerhash
    ADD CONSTRAINT consumer_hash_unique UNIQUE (hash, hash_type, consumer_id, broker_id);
ALTER TABLE integrations_consumerhash DROP CONSTRAINT integrations_consumerhash_pkey;
ALTER TABLE integrations_consumerhash
    ADD CONSTRAINT integrations_consumerhash_pkey PRIMARY KEY (id, broker_id);
"""

BACKWARD = """
ALTER TABLE integrations_consumerhash DROP CONSTRAINT consumer_hash_unique;
ALTER TABLE integrations_consumerhash
    ADD CONSTRAINT consumer_hash_unique UNIQUE (broker_id, hash, hash_type, consumer_id);
ALTER TABLE integrations_consumerhash DROP CONSTRAINT integrations_consumerhash_pkey;
ALTER TABLE integrations_consumerhash
    ADD CONSTRAINT integrations_consumerhash_pkey PRIMARY KEY (broker_id, id);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0026_consumer_hashes_partitioned_by_broker"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, reverse_sql=BACKWARD)],
            state_operations=[
                migrations.RemoveConstraint(model_name="consumerhash", name="consumer_hash_unique"),
                migrations.AddConstraint(
                    model_name="consumerhash",
                    constraint=models.UniqueConstraint(
                        fields=("hash", "hash_type", "consumer", "broker"),
                        name="consumer_hash_unique",
                    ),
                ),
            ],
        )
    ]
