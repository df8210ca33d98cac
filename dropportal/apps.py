"""The admin, with dropportal's own site (the dashboard as its index).

Listed in ``INSTALLED_APPS`` in place of ``django.contrib.admin``; ``admin.site`` and
``@admin.register`` then mean ``dropportal.admin.DropportalAdminSite``.
"""

from django.contrib.admin.apps import AdminConfig


class DropportalAdminConfig(AdminConfig):
    default_site = "dropportal.admin.DropportalAdminSite"

    def ready(self) -> None:
        super().ready()  # registers every app's ModelAdmins
        from django.contrib import admin
        from django_otp.plugins.otp_static.models import StaticDevice
        from django_otp.plugins.otp_totp.models import TOTPDevice

        from dropportal import security  # noqa: F401  (registers its system checks)
        from dropportal.unfold_list import (
            full_count_only_when_narrowed,
            result_headers_once_per_list,
        )

        result_headers_once_per_list()
        full_count_only_when_narrowed()

        # Their pages would show TOTP seeds and recovery codes: staff enrol at /admin/mfa/,
        # and a superuser resets a lost factor from the staff user list.
        for model in (TOTPDevice, StaticDevice):
            if admin.site.is_registered(model):
                admin.site.unregister(model)

        from integrations.admin.page_values import readonly_values_read_once
        from integrations.admin.superuser_only import narrow_to_superusers

        readonly_values_read_once()

        narrow_to_superusers(admin.site)
