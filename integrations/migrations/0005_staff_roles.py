"""Staff roles as groups (docs/operations.md, "Staff, roles and the admin"; issue #8).

- Connections managers: brokers, integrations (and their ISI connections), SaaS connections
  and API keys: add, change, view.
- Operators: deletion, resolution and SaaS deletion requests and work items: view and
  change (redeliver, redispatch, manual status); view of the cycle around them.
- Auditors: view of every model of the app (exports and the ledger included); nothing else.

A staff user also needs "staff status" to log in. The groups are frozen here by codename:
a later model gets its permissions by a later migration.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

CONNECTIONS = ["broker", "integration", "isiconnection", "saasconnection", "apikey"]
REQUESTS = ["deletionrequest", "resolutionrequest", "saasdeletion", "workitem"]
CYCLE_CONTEXT = [
    "broker",
    "integration",
    "isiconnection",
    "saasconnection",
    "consumer",
    "dropcycle",
    "reportfile",
    "deliveryattempt",
    "ledgerevent",
]
EVERY_MODEL = [
    "apikey",
    "broker",
    "consumer",
    "consumerhash",
    "deletionrequest",
    "deliveryattempt",
    "dropcycle",
    "integration",
    "isiconnection",
    "ledgerchainlink",
    "ledgerevent",
    "optoutrecord",
    "reportfile",
    "resolutionrequest",
    "saasconnection",
    "saasdeletion",
    "workitem",
]

ROLES = {
    "Connections managers": [
        f"{action}_{model}" for model in CONNECTIONS for action in ("add", "change", "view")
    ],
    "Operators": [
        *(f"{action}_{model}" for model in REQUESTS for action in ("change", "view")),
        *(f"view_{model}" for model in CYCLE_CONTEXT),
    ],
    "Auditors": [f"view_{model}" for model in EVERY_MODEL],
}


def create_roles(apps, schema_editor):
    # Permissions are normally created after the last migration; the groups need them now.
    app_config = apps.get_app_config("integrations")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in ROLES.items():
        permissions = list(
            Permission.objects.filter(
                content_type__app_label="integrations", codename__in=codenames
            )
        )
        missing = set(codenames) - {p.codename for p in permissions}
        if missing:
            raise RuntimeError(f"{name}: no permission {', '.join(sorted(missing))}")
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*permissions)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("integrations", "0004_broker_auto_pull"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
