from typing import Any

from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.db import migrations, models
from django.utils import timezone


def _user_id(session_data: str) -> int | None:
    # Django's store decodes it ({} when it cannot): its salt is its class's name, the new
    # engine's too.
    user_id = str(SessionStore().decode(session_data).get(SESSION_KEY) or "")
    return int(user_id) if user_id.isdigit() else None


def sessions_moved_in(apps: Any, schema_editor: Any) -> None:
    """The open sessions move to the new table with their user: nobody is signed out."""
    old = apps.get_model("sessions", "Session")
    new = apps.get_model("integrations", "AdminSession")
    live = old.objects.filter(expire_date__gt=timezone.now())
    new.objects.bulk_create(
        (
            new(
                session_key=s.session_key,
                session_data=s.session_data,
                expire_date=s.expire_date,
                user_id=_user_id(s.session_data),
            )
            for s in live.iterator()
        ),
        batch_size=1000,
    )
    old.objects.all().delete()


def sessions_moved_back(apps: Any, schema_editor: Any) -> None:
    old = apps.get_model("sessions", "Session")
    new = apps.get_model("integrations", "AdminSession")
    old.objects.bulk_create(
        (
            old(session_key=s.session_key, session_data=s.session_data, expire_date=s.expire_date)
            for s in new.objects.iterator()
        ),
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("integrations", "0063_deletion_request_requeued"),
        ("sessions", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="AdminSession",
            fields=[
                (
                    "session_key",
                    models.CharField(
                        max_length=40, primary_key=True, serialize=False, verbose_name="session key"
                    ),
                ),
                ("session_data", models.TextField(verbose_name="session data")),
                ("expire_date", models.DateTimeField(db_index=True, verbose_name="expire date")),
                ("user_id", models.IntegerField(db_index=True, null=True)),
            ],
            options={
                "verbose_name": "admin session",
                "verbose_name_plural": "admin sessions",
                "abstract": False,
            },
        ),
        migrations.RunPython(sessions_moved_in, sessions_moved_back),
    ]
