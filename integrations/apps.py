from django.apps import AppConfig


class IntegrationsConfig(AppConfig):
    name = "integrations"
    verbose_name = "DROP integrations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from integrations.dispatch import checks  # noqa: F401  (registers the system check)
