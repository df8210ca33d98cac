"""A broker's "approve uploads": response files wait for a second person before DROP.

The Operators role gets the permission to approve or reject a file here, frozen by codename;
Auditors do not (view only).
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations, models

GRANTS = {"Operators": ["approve_reportfile"]}


def grant_roles(apps, schema_editor):
    # Permissions are normally created after the last migration; the groups need them now.
    app_config = apps.get_app_config("integrations")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GRANTS.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.add(
                *Permission.objects.filter(
                    content_type__app_label="integrations", codename__in=codenames
                )
            )


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("integrations", "0039_ledger_kinds_of_the_continuing_duty"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="reportfile",
            options={
                "ordering": ["-created_at"],
                "permissions": [
                    (
                        "approve_reportfile",
                        "Can approve or reject a response file before its upload",
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="broker",
            name="approve_uploads",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Every response file (upload or amendment) waits until an Operator other than whoever wrote it approves it; only then is it uploaded to DROP.",
                verbose_name="approve uploads",
            ),
        ),
        migrations.AddField(
            model_name="reportfile",
            name="review_reason",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="reportfile",
            name="reviewed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="reportfile",
            name="reviewed_by",
            field=models.CharField(blank=True, default="", max_length=150),
        ),
        migrations.AddField(
            model_name="reportfile",
            name="written_by",
            field=models.CharField(blank=True, default="", max_length=150),
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
                    ("recurring.rounds_sent", "recurring.rounds_sent"),
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
                    ("service_provider.added", "service_provider.added"),
                    ("service_provider.updated", "service_provider.updated"),
                    ("directive.issued", "directive.issued"),
                    ("directive.delivered", "directive.delivered"),
                    ("directive.delivery_failed", "directive.delivery_failed"),
                    ("directive.downloaded", "directive.downloaded"),
                    ("directive.acknowledged", "directive.acknowledged"),
                    ("report_file.written", "report_file.written"),
                    ("report_file.upload_failed", "report_file.upload_failed"),
                    ("report_file.accepted", "report_file.accepted"),
                    ("report_file.rejected", "report_file.rejected"),
                    ("report_file.marked_uploaded", "report_file.marked_uploaded"),
                    ("report_file.refused", "report_file.refused"),
                    ("report_file.discarded", "report_file.discarded"),
                    ("report_file.awaiting_approval", "report_file.awaiting_approval"),
                    ("report_file.approved", "report_file.approved"),
                    ("report_file.approval_rejected", "report_file.approval_rejected"),
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
        migrations.AlterField(
            model_name="reportfile",
            name="state",
            field=models.CharField(
                choices=[
                    ("awaiting_approval", "Waiting for approval"),
                    ("written", "Written, not uploaded"),
                    ("accepted", "Accepted by DROP"),
                    ("rejected", "Rejected by DROP"),
                    ("manual", "Marked uploaded by hand"),
                    ("refused", "Refused by DROP, sent again each run"),
                    ("discarded", "Discarded by staff"),
                    ("not_approved", "Not approved, not uploaded"),
                ],
                default="written",
                max_length=20,
            ),
        ),
        migrations.RunPython(grant_roles, migrations.RunPython.noop),
    ]
