"""WSGI entry point for gunicorn: ``gunicorn dropportal.wsgi``.

A web process starts only as a command would: the settings' own refusals (a secret missing
with ``DATABASE_URL``, ...), the system checks' errors (``dropportal.E001``, a plain-http
public URL off loopback, among them) and ``DROPPORTAL_ENCRYPTION_KEYS`` unable to read the
stored secrets each stop it with one line on stderr. The exit code is gunicorn's "the app
failed to load", so gunicorn stops instead of restarting workers that cannot start.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from dropportal import setting_up

if TYPE_CHECKING:
    from django.core.handlers.wsgi import WSGIHandler

# gunicorn's Arbiter.APP_LOAD_ERROR: the arbiter halts rather than respawn the worker.
APP_LOAD_ERROR = 4

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")


def _refuse(line: str) -> None:
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()
    sys.exit(APP_LOAD_ERROR)


def _checked_application() -> WSGIHandler:
    from django.core.wsgi import get_wsgi_application

    try:
        application = get_wsgi_application()
    except SystemExit as exc:  # settings.py refused, in one line of its own
        _refuse(
            str(exc.code) if isinstance(exc.code, str) else "error: the settings refused to load"
        )
    from dropportal.startup import bound_web_statements, start_refusals  # needs the registry

    for refusal in start_refusals():
        _refuse(f"error: {refusal}")
    bound_web_statements()
    return application


# The collector is back on however set-up ends (runserver imports this in a thread of its own).
with setting_up.collector_paused():
    application = _checked_application()
