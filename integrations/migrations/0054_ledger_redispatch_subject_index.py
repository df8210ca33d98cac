"""A partial index on a request's redispatches and redeliveries in the ledger, by subject.

A callback's stale-failure check (``dropportal_deletion_outcome_record``, migration 0053) and
the automatic redispatch policy's count read them for one request; through the index on kind
alone they scanned every such event, which pile up for good. Creating an index writes no row:
the ledger's append-only triggers (0002, 0050) do not apply.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0053_stale_failure_before_redispatch"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="ledgerevent",
            index=models.Index(
                condition=models.Q(
                    (
                        "kind__in",
                        [
                            "deletion_request.redispatched",
                            "deletion_request.redelivery_requested",
                        ],
                    )
                ),
                fields=["subject", "id"],
                name="ledger_redispatch_subject",
            ),
        ),
    ]
