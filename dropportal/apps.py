"""The admin, with dropportal's own site (the dashboard as its index).

Listed in ``INSTALLED_APPS`` in place of ``django.contrib.admin``; ``admin.site`` and
``@admin.register`` then mean ``dropportal.admin.DropportalAdminSite``.
"""

from django.contrib.admin.apps import AdminConfig


class DropportalAdminConfig(AdminConfig):
    default_site = "dropportal.admin.DropportalAdminSite"
