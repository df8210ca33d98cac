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
