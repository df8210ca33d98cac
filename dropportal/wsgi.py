"""WSGI entry point for gunicorn: ``gunicorn dropportal.wsgi``."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
application = get_wsgi_application()
