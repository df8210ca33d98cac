"""One proxy model per kind of integration, each with its own admin pages.

A proxy model has its own permissions: each role gets on a kind's pages what it has on the
integration list (Connections managers add, change, view; Operators and Auditors view).
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

KINDS = ["webhookintegration", "isiintegration"]


def grant_as_on_integrations(apps, schema_editor):
    # Permissions are normally created after the last migration; the groups need them now.
    app_config = apps.get_app_config("integrations")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ours = Permission.objects.filter(content_type__app_label="integrations")
    for group in Group.objects.all():
        held = group.permissions.filter(
            content_type__app_label="integrations", content_type__model="integration"
        ).values_list("codename", flat=True)
        actions = [codename.removesuffix("_integration") for codename in held]
        group.permissions.add(
            *ours.filter(codename__in=[f"{a}_{kind}" for a in actions for kind in KINDS])
        )


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("integrations", "0032_outcome_details_as_jsonb"),
    ]

    operations = [
        migrations.CreateModel(
            name="IsiIntegration",
            fields=[],
            options={
                "verbose_name": "ISI integration",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("integrations.integration",),
        ),
        migrations.CreateModel(
            name="WebhookIntegration",
            fields=[],
            options={
                "verbose_name": "webhook integration",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("integrations.integration",),
        ),
        migrations.RunPython(grant_as_on_integrations, migrations.RunPython.noop),
    ]
