"""Each SaaS connection gets a UUID, as each integration has, for ``saas retire UUID``.

Added empty, filled with PostgreSQL's random UUIDs for the connections there are, then made
unique and given its default: a plain ``AddField`` with a Python default would give every
existing row the same value and break the unique index.
"""

import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0057_ledger_pattern_indexes_dropped"),
    ]

    operations = [
        migrations.AddField(
            model_name="saasconnection",
            name="uuid",
            field=models.UUIDField(editable=False, null=True, verbose_name="UUID"),
        ),
        migrations.RunSQL(
            sql="UPDATE integrations_saasconnection SET uuid = gen_random_uuid() WHERE uuid IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="saasconnection",
            name="uuid",
            field=models.UUIDField(
                default=uuid.uuid4, editable=False, unique=True, verbose_name="UUID"
            ),
        ),
    ]
