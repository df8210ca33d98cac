"""Suppression and reappearances: the ``suppression`` API key scope, the ledger kinds of
the suppression check and export and of reappearances, and the ``Reappearance`` model,
which those who read the cycle may view (Operators, Auditors).
"""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.db.models.functions.datetime
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

# Who reads reappearances: those who read the cycle.
ROLES = {"Operators": ["view_reappearance"], "Auditors": ["view_reappearance"]}


def grant_view(apps, schema_editor):
    # Permissions are normally created after the last migration; the groups need them now.
    app_config = apps.get_app_config("integrations")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in ROLES.items():
        permissions = Permission.objects.filter(
            content_type__app_label="integrations", codename__in=codenames
        )
        for group in Group.objects.filter(name=name):
            group.permissions.add(*permissions)


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0035_drop_access_and_match_rates"),
    ]

    operations = [
        migrations.CreateModel(
            name="Reappearance",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("remote_identifier", models.CharField(max_length=255)),
                ("source", models.CharField(max_length=1024)),
                (
                    "source_sha256",
                    models.CharField(
                        blank=True, default="", max_length=64, verbose_name="source SHA-256"
                    ),
                ),
                (
                    "api_key_prefix",
                    models.CharField(
                        blank=True, default="", max_length=16, verbose_name="API key prefix"
                    ),
                ),
                (
                    "reappeared_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "ordering": ["-reappeared_at", "-id"],
            },
        ),
        migrations.RemoveConstraint(
            model_name="apikey",
            name="api_key_scopes_known",
        ),
        migrations.AlterField(
            model_name="apikey",
            name="scopes",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(
                    choices=[
                        ("webhook_callback", "Webhook callback"),
                        ("ingest", "Ingest consumers"),
                        ("audit", "Audit (outcome history)"),
                        ("metrics", "Metrics (Prometheus scrape)"),
                        ("suppression", "Suppression check"),
                    ],
                    max_length=32,
                ),
                size=None,
            ),
        ),
        migrations.AlterField(
            model_name="ledgerevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("broker.created", "broker.created"),
                    ("broker.updated", "broker.updated"),
                    ("api_key.created", "api_key.created"),
                    ("api_key.revoked", "api_key.revoked"),
                    ("secrets.reencrypted", "secrets.reencrypted"),
                    ("drop.api_call", "drop.api_call"),
                    ("drop.pulled", "drop.pulled"),
                    ("drop.pull_failed", "drop.pull_failed"),
                    ("drop.import_refused", "drop.import_refused"),
                    ("drop.cycle_imported", "drop.cycle_imported"),
                    ("drop.package_members_skipped", "drop.package_members_skipped"),
                    ("drop.work_items_removed", "drop.work_items_removed"),
                    ("drop.late_matched", "drop.late_matched"),
                    ("drop.doctor_checked", "drop.doctor_checked"),
                    ("drop_cycle.reported", "drop_cycle.reported"),
                    ("drop.notification_received", "drop.notification_received"),
                    ("work_item.status_set", "work_item.status_set"),
                    ("work_item.status_settled", "work_item.status_settled"),
                    ("consumers.registered", "consumers.registered"),
                    ("consumer.forgotten", "consumer.forgotten"),
                    ("consumers.replaced", "consumers.replaced"),
                    ("consumers.reappeared", "consumers.reappeared"),
                    ("suppression.checked", "suppression.checked"),
                    ("suppression.exported", "suppression.exported"),
                    ("deletion_requests.created", "deletion_requests.created"),
                    ("pending_requests.targeted", "pending_requests.targeted"),
                    ("deletion_request.delivered", "deletion_request.delivered"),
                    ("deletion_request.delivery_failed", "deletion_request.delivery_failed"),
                    ("deletion_request.undeliverable", "deletion_request.undeliverable"),
                    ("deletion_request.cancelled", "deletion_request.cancelled"),
                    ("deletion_request.outcome_recorded", "deletion_request.outcome_recorded"),
                    ("deletion_request.outcome_repeated", "deletion_request.outcome_repeated"),
                    (
                        "deletion_request.redelivery_requested",
                        "deletion_request.redelivery_requested",
                    ),
                    ("deletion_request.redispatched", "deletion_request.redispatched"),
                    ("resolution_request.delivered", "resolution_request.delivered"),
                    ("resolution_request.delivery_failed", "resolution_request.delivery_failed"),
                    ("resolution_request.undeliverable", "resolution_request.undeliverable"),
                    ("resolution_request.cancelled", "resolution_request.cancelled"),
                    ("resolution_request.outcome_recorded", "resolution_request.outcome_recorded"),
                    ("resolution_request.outcome_repeated", "resolution_request.outcome_repeated"),
                    (
                        "resolution_request.identifiers_purged",
                        "resolution_request.identifiers_purged",
                    ),
                    (
                        "resolution_request.redelivery_requested",
                        "resolution_request.redelivery_requested",
                    ),
                    ("saas_deletion.delivered", "saas_deletion.delivered"),
                    ("saas_deletion.delivery_failed", "saas_deletion.delivery_failed"),
                    ("saas_deletion.undeliverable", "saas_deletion.undeliverable"),
                    ("saas_deletion.cancelled", "saas_deletion.cancelled"),
                    ("saas_deletion.redelivery_requested", "saas_deletion.redelivery_requested"),
                    ("integration.created", "integration.created"),
                    ("integration.updated", "integration.updated"),
                    ("integration.secret_rotated", "integration.secret_rotated"),
                    ("integration.disabled", "integration.disabled"),
                    ("integration.enabled", "integration.enabled"),
                    ("integration.retired", "integration.retired"),
                    ("integration.test_sent", "integration.test_sent"),
                    ("isi.connections_refreshed", "isi.connections_refreshed"),
                    ("isi.connections_refresh_failed", "isi.connections_refresh_failed"),
                    ("saas_connection.created", "saas_connection.created"),
                    ("saas_connection.updated", "saas_connection.updated"),
                    ("saas_connection.disabled", "saas_connection.disabled"),
                    ("saas_connection.enabled", "saas_connection.enabled"),
                    ("saas_connection.retired", "saas_connection.retired"),
                    ("callback.rejected", "callback.rejected"),
                    ("report_file.written", "report_file.written"),
                    ("report_file.upload_failed", "report_file.upload_failed"),
                    ("report_file.accepted", "report_file.accepted"),
                    ("report_file.rejected", "report_file.rejected"),
                    ("report_file.marked_uploaded", "report_file.marked_uploaded"),
                    ("report_file.refused", "report_file.refused"),
                    ("report_file.discarded", "report_file.discarded"),
                    ("staff_user.added", "staff_user.added"),
                    ("staff_user.changed", "staff_user.changed"),
                    ("staff_user.deleted", "staff_user.deleted"),
                    ("staff_user.mfa_enrolled", "staff_user.mfa_enrolled"),
                    (
                        "staff_user.mfa_recovery_codes_renewed",
                        "staff_user.mfa_recovery_codes_renewed",
                    ),
                    ("staff_user.mfa_reset", "staff_user.mfa_reset"),
                    ("staff_user.password_reset", "staff_user.password_reset"),
                    ("group.added", "group.added"),
                    ("group.changed", "group.changed"),
                    ("group.deleted", "group.deleted"),
                    ("outcomes.exported", "outcomes.exported"),
                    ("ledger.exported", "ledger.exported"),
                    ("report_files.exported", "report_files.exported"),
                    ("evidence.exported", "evidence.exported"),
                    ("ledger.verified", "ledger.verified"),
                    ("alert.raised", "alert.raised"),
                    ("alert.cleared", "alert.cleared"),
                    ("job.stalled_retried", "job.stalled_retried"),
                ],
                db_index=True,
                max_length=64,
            ),
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "scopes__contained_by",
                        ["webhook_callback", "ingest", "audit", "metrics", "suppression"],
                    ),
                    models.Q(("scopes", []), _negated=True),
                ),
                name="api_key_scopes_known",
            ),
        ),
        migrations.AddField(
            model_name="reappearance",
            name="broker",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="integrations.broker",
            ),
        ),
        migrations.AddField(
            model_name="reappearance",
            name="consumer",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="integrations.consumer",
            ),
        ),
        migrations.AddField(
            model_name="reappearance",
            name="work_item",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reappearances",
                to="integrations.workitem",
            ),
        ),
        migrations.AddIndex(
            model_name="reappearance",
            index=models.Index(fields=["broker", "reappeared_at"], name="reappearance_broker_at"),
        ),
        migrations.RunPython(grant_view, migrations.RunPython.noop),
    ]
