# Labels staff read (DROP, ISI, SaaS, Broker ID, UUID): names only, no SQL.

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0022_retired_targets"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="consumerhash",
            options={"verbose_name_plural": "consumer hashes"},
        ),
        migrations.AlterModelOptions(
            name="dropcycle",
            options={"ordering": ["-downloaded_at"], "verbose_name": "DROP cycle"},
        ),
        migrations.AlterModelOptions(
            name="isiconnection",
            options={"verbose_name": "ISI connection"},
        ),
        migrations.AlterModelOptions(
            name="saasdeletion",
            options={"verbose_name": "SaaS deletion"},
        ),
        migrations.AlterField(
            model_name="deletionrequest",
            name="broker_id_code",
            field=models.CharField(max_length=4, verbose_name="Broker ID"),
        ),
        migrations.AlterField(
            model_name="deletionrequest",
            name="drop_outcome",
            field=models.CharField(
                blank=True,
                choices=[
                    ("deleted", "Deleted (3)"),
                    ("not_found", "Not found (5)"),
                    ("opted_out", "Opted out (4)"),
                    ("exempt", "Exempt (2)"),
                    ("failed", "Failed"),
                ],
                default="",
                max_length=12,
                verbose_name="DROP outcome",
            ),
        ),
        migrations.AlterField(
            model_name="deletionrequest",
            name="drop_session_id",
            field=models.CharField(max_length=20, verbose_name="DROP session ID"),
        ),
        migrations.AlterField(
            model_name="deletionrequest",
            name="drop_status_code",
            field=models.PositiveSmallIntegerField(
                blank=True, null=True, verbose_name="DROP status code"
            ),
        ),
        migrations.AlterField(
            model_name="deletionrequest",
            name="isi_connection",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="integrations.isiconnection",
                verbose_name="ISI connection",
            ),
        ),
        migrations.AlterField(
            model_name="deletionrequest",
            name="request_uuid",
            field=models.UUIDField(
                default=uuid.uuid4, editable=False, unique=True, verbose_name="request UUID"
            ),
        ),
        migrations.AlterField(
            model_name="deletionrequest",
            name="webhook_request_id",
            field=models.UUIDField(
                default=uuid.uuid4, editable=False, verbose_name="webhook request ID"
            ),
        ),
        migrations.AlterField(
            model_name="deliveryattempt",
            name="saas_deletion",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="delivery_attempts",
                to="integrations.saasdeletion",
                verbose_name="SaaS deletion",
            ),
        ),
        migrations.AlterField(
            model_name="dropcycle",
            name="drop_session_id",
            field=models.CharField(max_length=20, verbose_name="DROP session ID"),
        ),
        migrations.AlterField(
            model_name="dropcycle",
            name="zip_name",
            field=models.CharField(max_length=255, verbose_name="package"),
        ),
        migrations.AlterField(
            model_name="dropcycle",
            name="zip_sha256",
            field=models.CharField(max_length=64, verbose_name="package SHA-256"),
        ),
        migrations.AlterField(
            model_name="integration",
            name="uuid",
            field=models.UUIDField(
                default=uuid.uuid4, editable=False, unique=True, verbose_name="UUID"
            ),
        ),
        migrations.AlterField(
            model_name="isiconnection",
            name="uuid",
            field=models.UUIDField(verbose_name="UUID"),
        ),
        migrations.AlterField(
            model_name="ledgerevent",
            name="broker_id",
            field=models.CharField(
                blank=True, db_index=True, default="", max_length=4, verbose_name="Broker ID"
            ),
        ),
        migrations.AlterField(
            model_name="reportfile",
            name="drop_response",
            field=models.JSONField(blank=True, default=dict, verbose_name="DROP's answer"),
        ),
        migrations.AlterField(
            model_name="reportfile",
            name="sha256",
            field=models.CharField(max_length=64, verbose_name="SHA-256"),
        ),
        migrations.AlterField(
            model_name="resolutionrequest",
            name="drop_outcome",
            field=models.CharField(
                blank=True, default="", max_length=12, verbose_name="DROP outcome"
            ),
        ),
        migrations.AlterField(
            model_name="resolutionrequest",
            name="drop_session_id",
            field=models.CharField(max_length=20, verbose_name="DROP session ID"),
        ),
        migrations.AlterField(
            model_name="resolutionrequest",
            name="isi_connection",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="integrations.isiconnection",
                verbose_name="ISI connection",
            ),
        ),
        migrations.AlterField(
            model_name="resolutionrequest",
            name="request_uuid",
            field=models.UUIDField(
                default=uuid.uuid4, editable=False, unique=True, verbose_name="request UUID"
            ),
        ),
        migrations.AlterField(
            model_name="resolutionrequest",
            name="webhook_request_id",
            field=models.UUIDField(
                default=uuid.uuid4, editable=False, verbose_name="webhook request ID"
            ),
        ),
        migrations.AlterField(
            model_name="saasdeletion",
            name="saas_connection",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="deletions",
                to="integrations.saasconnection",
                verbose_name="SaaS connection",
            ),
        ),
        migrations.AlterField(
            model_name="workitem",
            name="reported_status_code",
            field=models.PositiveSmallIntegerField(
                blank=True, null=True, verbose_name="DROP status reported"
            ),
        ),
        migrations.AlterField(
            model_name="workitem",
            name="status_code",
            field=models.PositiveSmallIntegerField(
                blank=True, null=True, verbose_name="DROP status"
            ),
        ),
        migrations.AlterField(
            model_name="workitem",
            name="work_item_id",
            field=models.CharField(max_length=64, verbose_name="work item ID"),
        ),
    ]
