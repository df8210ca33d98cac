"""What each role may do (SECURITY.md, "What each role may do"), and metrics keys of every broker.

- Two permissions of their own, given to Auditors only (superusers hold every permission):
  ``export_audit_records`` (the ledger, outcome history and evidence pack exports) and
  ``add_audit_apikey`` (minting an API key with the ``audit`` scope). Until now whoever could
  add a key (Connections managers) could mint one that reads every outcome, and whoever could
  view the cycle (Operators) could export it all.
- ``ApiKey.broker`` may be empty, for a ``metrics`` key alone: the operator's Prometheus key,
  which sees every broker's series; every other key sees its own broker's only. The API key
  lookup (``sql/api_key_lookup.sql``, a frozen copy in ``migrations/sql/0021/``) joins the
  broker with a LEFT JOIN so that such a key is found.

The groups' permissions are frozen here by codename; a later change is a later migration.
"""

from pathlib import Path

import django.db.models.deletion
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

SQL = Path(__file__).resolve().parent / "sql" / "0021" / "api_key_lookup.sql"
PREVIOUS_SQL = Path(__file__).resolve().parent / "sql" / "0013" / "api_key_lookup.sql"

AUDITORS = "Auditors"
AUDITOR_ONLY = ["export_audit_records", "add_audit_apikey"]


def grant_auditors(apps, schema_editor):
    # Permissions are normally created after the last migration; the group needs them now.
    app_config = apps.get_app_config("integrations")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    permissions = list(
        Permission.objects.filter(content_type__app_label="integrations", codename__in=AUDITOR_ONLY)
    )
    if len(permissions) != len(AUDITOR_ONLY):
        raise RuntimeError(f"missing permissions among {', '.join(AUDITOR_ONLY)}")
    group, _ = Group.objects.get_or_create(name=AUDITORS)
    group.permissions.add(*permissions)


def revoke_auditors(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group = Group.objects.filter(name=AUDITORS).first()
    if group is not None:
        group.permissions.remove(
            *Permission.objects.filter(
                content_type__app_label="integrations", codename__in=AUDITOR_ONLY
            )
        )


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0020_staff_mfa_encrypted"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="apikey",
            options={
                "ordering": ["-created_at"],
                "permissions": [("add_audit_apikey", "Can create API keys with the audit scope")],
                "verbose_name": "API key",
            },
        ),
        migrations.AlterModelOptions(
            name="ledgerevent",
            options={
                "ordering": ["id"],
                "permissions": [
                    (
                        "export_audit_records",
                        "Can export the ledger, outcome history and evidence packs",
                    )
                ],
            },
        ),
        migrations.AlterField(
            model_name="apikey",
            name="broker",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="integrations.broker",
            ),
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("broker__isnull", False), ("scopes", ["metrics"]), _connector="OR"
                ),
                name="api_key_without_broker_metrics_only",
            ),
        ),
        migrations.RunSQL(
            SQL.read_text(encoding="utf-8"), reverse_sql=PREVIOUS_SQL.read_text(encoding="utf-8")
        ),
        migrations.RunPython(grant_auditors, revoke_auditors),
    ]
