"""Each SaaS connection gets a UUID, as each integration has, for ``saas retire UUID``.

Its database default is ``gen_random_uuid()``, volatile, so PostgreSQL gives each existing
row its own as the column is added; and a row inserted by code that predates the column
(during an upgrade) still gets one.
"""

import uuid

import django.contrib.postgres.functions
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0057_ledger_pattern_indexes_dropped"),
    ]

    operations = [
        migrations.AddField(
            model_name="saasconnection",
            name="uuid",
            field=models.UUIDField(
                db_default=django.contrib.postgres.functions.RandomUUID(),
                default=uuid.uuid4,
                editable=False,
                unique=True,
                verbose_name="UUID",
            ),
        ),
    ]
