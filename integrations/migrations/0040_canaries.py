"""Canaries (consumers a broker keeps for testing its deletion system) and their rounds; a
deletion request belongs to a work item or to a canary round. Each role gets its permissions
here, frozen by codename: Connections managers name and remove canaries, Operators and
Auditors see them and their rounds.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

GRANTS = {
    "Connections managers": ["view_canary", "add_canary", "delete_canary", "view_canaryround"],
    "Operators": ["view_canary", "view_canaryround"],
    "Auditors": ["view_canary", "view_canaryround"],
}


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
        migrations.AlterField(
            model_name="deletionrequest",
            name="work_item",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="deletion_requests",
                to="integrations.workitem",
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
                    ("canary.added", "canary.added"),
                    ("canary.removed", "canary.removed"),
                    ("canary.round_sent", "canary.round_sent"),
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
            name="Canary",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("remote_identifier", models.CharField(max_length=255)),
                ("added_by", models.CharField(max_length=150)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "broker",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="canaries",
                        to="integrations.broker",
                    ),
                ),
            ],
            options={
                "ordering": ["broker", "remote_identifier"],
            },
        ),
        migrations.CreateModel(
            name="CanaryRound",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("started_at", models.DateTimeField()),
                ("answer_by", models.DateTimeField()),
                ("actor", models.CharField(max_length=150)),
                ("canaries", models.JSONField(default=list)),
                ("missing", models.JSONField(blank=True, default=list)),
                ("targets", models.PositiveIntegerField(default=0)),
                (
                    "broker",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="canary_rounds",
                        to="integrations.broker",
                    ),
                ),
                (
                    "cycle",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="integrations.dropcycle",
                    ),
                ),
            ],
            options={
                "ordering": ["-started_at", "-pk"],
            },
        ),
        migrations.AddField(
            model_name="deletionrequest",
            name="canary_round",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="deletion_requests",
                to="integrations.canaryround",
            ),
        ),
        migrations.AddConstraint(
            model_name="deletionrequest",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("canary_round__isnull", True), ("work_item__isnull", False)),
                    models.Q(("canary_round__isnull", False), ("work_item__isnull", True)),
                    _connector="OR",
                ),
                name="deletion_request_of_work_item_or_canary",
            ),
        ),
        migrations.AddConstraint(
            model_name="canary",
            constraint=models.UniqueConstraint(
                fields=("broker", "remote_identifier"), name="canary_unique_per_broker"
            ),
        ),
        migrations.RunPython(grant_roles, migrations.RunPython.noop),
    ]
