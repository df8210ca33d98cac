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
