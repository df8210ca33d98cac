"""Service providers and contractors, their directives, and the key scope they acknowledge with.

Each role gets its permissions here, frozen by codename: Connections managers register
providers, Operators and Auditors see them and their directives, Operators record an
acknowledgement.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.db.models.functions.datetime
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

GRANTS = {
    "Connections managers": [
        "view_serviceprovider",
        "add_serviceprovider",
        "change_serviceprovider",
    ],
    "Operators": ["view_serviceprovider", "view_directive", "acknowledge_directive"],
    "Auditors": ["view_serviceprovider", "view_directive"],
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
        ("integrations", "0036_suppression_and_reappearances"),
    ]

    operations = [
        migrations.CreateModel(
            name="Directive",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "reason",
                    models.CharField(
                        choices=[
                            ("match", "A DROP cycle matched"),
                            ("late_match", "Consumers registered later matched"),
                            ("recurring", "A recurring deletion round"),
                        ],
                        max_length=16,
                    ),
                ),
                ("content", models.BinaryField()),
                ("sha256", models.CharField(max_length=64, verbose_name="SHA-256")),
                ("signature", models.TextField()),
                ("key_fingerprint", models.CharField(max_length=64)),
                ("rows", models.PositiveIntegerField()),
                ("rows_by_hash_type", models.JSONField(default=dict)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "s3_uri",
                    models.CharField(
                        blank=True, default="", max_length=600, verbose_name="S3 object"
                    ),
                ),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                ("delivery_error", models.CharField(blank=True, default="", max_length=500)),
                ("acknowledged_at", models.DateTimeField(blank=True, null=True)),
                ("acknowledged_by", models.CharField(blank=True, default="", max_length=200)),
                (
                    "acknowledgement_reference",
                    models.CharField(blank=True, default="", max_length=500),
                ),
            ],
            options={
                "ordering": ["-created_at", "-id"],
                "permissions": [
                    ("acknowledge_directive", "Can record a directive's acknowledgement")
                ],
            },
        ),
        migrations.CreateModel(
            name="ServiceProvider",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("contact", models.EmailField(blank=True, default="", max_length=254)),
                (
                    "s3_prefix",
                    models.CharField(
                        blank=True, default="", max_length=500, verbose_name="S3 prefix"
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "service provider or contractor",
                "verbose_name_plural": "service providers and contractors",
                "ordering": ["broker__broker_id", "name"],
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
                        (
                            "directive_ack",
                            "Directive acknowledgement (a service provider's own key)",
                        ),
                    ],
                    max_length=32,
                ),
                size=None,
            ),
        ),
        migrations.AddField(
            model_name="directive",
            name="broker",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="integrations.broker",
            ),
        ),
        migrations.AddField(
            model_name="serviceprovider",
            name="broker",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="service_providers",
                to="integrations.broker",
            ),
        ),
        migrations.AddField(
            model_name="directive",
            name="provider",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="directives",
                to="integrations.serviceprovider",
            ),
        ),
        migrations.AddField(
            model_name="apikey",
            name="provider",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="api_keys",
                to="integrations.serviceprovider",
            ),
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "scopes__contained_by",
                        [
                            "webhook_callback",
                            "ingest",
                            "audit",
                            "metrics",
                            "suppression",
                            "directive_ack",
                        ],
                    ),
                    models.Q(("scopes", []), _negated=True),
                ),
                name="api_key_scopes_known",
            ),
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("provider__isnull", True),
                        models.Q(("scopes__contains", ["directive_ack"]), _negated=True),
                    ),
                    models.Q(("provider__isnull", False), ("scopes", ["directive_ack"])),
                    _connector="OR",
                ),
                name="api_key_directive_ack_bound_to_provider",
            ),
        ),
        migrations.AddConstraint(
            model_name="serviceprovider",
            constraint=models.UniqueConstraint(
                fields=("broker", "name"), name="service_provider_name_unique"
            ),
        ),
        migrations.AddIndex(
            model_name="directive",
            index=models.Index(
                condition=models.Q(("acknowledged_at__isnull", True)),
                fields=["created_at"],
                name="directive_unacknowledged",
            ),
        ),
        migrations.RunPython(grant_roles, migrations.RunPython.noop),
    ]
