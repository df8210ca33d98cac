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
        ("integrations", "0040_canaries"),
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
