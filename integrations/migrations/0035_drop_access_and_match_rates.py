"""DROP access (outages and the notice a long one obliges) and each cycle's match rate per
list type. Operators may record a notice (change an obligation); they and Auditors see
both tables.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

GRANTS = {
    "Operators": ["view_dropoutage", "view_dropaccessobligation", "change_dropaccessobligation"],
    "Auditors": ["view_dropoutage", "view_dropaccessobligation"],
}


def grant(apps, schema_editor):
    # Permissions are normally created after the last migration; the groups need them now.
    app_config = apps.get_app_config("integrations")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ours = Permission.objects.filter(content_type__app_label="integrations")
    for name, codenames in GRANTS.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.add(*ours.filter(codename__in=codenames))


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("integrations", "0034_status_fields_keep_removed"),
    ]

    operations = [
        migrations.AddField(
            model_name="dropcycle",
            name="match_rates",
            field=models.JSONField(blank=True, default=dict),
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
                    ("drop.outage_started", "drop.outage_started"),
                    ("drop.outage_ended", "drop.outage_ended"),
                    ("drop.access_obligation_created", "drop.access_obligation_created"),
                    ("drop.access_notice_recorded", "drop.access_notice_recorded"),
                    ("work_item.status_set", "work_item.status_set"),
                    ("work_item.status_settled", "work_item.status_settled"),
                    ("consumers.registered", "consumers.registered"),
                    ("consumer.forgotten", "consumer.forgotten"),
                    ("consumers.replaced", "consumers.replaced"),
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
        migrations.CreateModel(
            name="DropOutage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("started_at", models.DateTimeField()),
                ("last_failure_at", models.DateTimeField()),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                ("failures", models.PositiveIntegerField(default=1)),
                ("last_error", models.TextField(blank=True, default="")),
                (
                    "broker",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="integrations.broker",
                    ),
                ),
            ],
            options={
                "verbose_name": "DROP outage",
                "ordering": ["-started_at"],
            },
        ),
        migrations.CreateModel(
            name="DropAccessObligation",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("failure_started_at", models.DateTimeField()),
                ("due_date", models.DateField()),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("notice_sent_on", models.DateField(blank=True, null=True)),
                ("notice_reference", models.CharField(blank=True, default="", max_length=255)),
                ("notice_recorded_by", models.CharField(blank=True, default="", max_length=150)),
                ("notice_recorded_at", models.DateTimeField(blank=True, null=True)),
                (
                    "broker",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="integrations.broker",
                    ),
                ),
                (
                    "outage",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="obligation",
                        to="integrations.dropoutage",
                    ),
                ),
            ],
            options={
                "verbose_name": "DROP access obligation",
                "ordering": ["due_date", "pk"],
            },
        ),
        migrations.AddConstraint(
            model_name="dropoutage",
            constraint=models.UniqueConstraint(
                condition=models.Q(("ended_at__isnull", True)),
                fields=("broker",),
                name="drop_outage_one_ongoing",
            ),
        ),
        migrations.AddConstraint(
            model_name="dropaccessobligation",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("notice_sent_on__isnull", True),
                    models.Q(("notice_reference", ""), _negated=True),
                    _connector="OR",
                ),
                name="drop_access_notice_has_reference",
            ),
        ),
        migrations.RunPython(grant, migrations.RunPython.noop),
    ]
