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
