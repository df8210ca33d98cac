"""What stops a web process at start, as ``manage.py`` commands are stopped::

    for line in start_refusals(): ...   # one line each; none: start

The system checks' errors (``dropportal.E001`` among them; warnings are left to
``manage.py check``) and ``DROPPORTAL_ENCRYPTION_KEYS`` unable to read the stored secrets. An
unreachable database stops nothing: the process answers 503 until it is back.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections

from integrations.services.secrets import encryption_keys_check


def start_refusals() -> list[str]:
    refusals = [
        f"{message.msg} ({message.id}{'; ' + message.hint if message.hint else ''})"
        for message in checks.run_checks(include_deployment_checks=False)
        if message.is_serious() and not message.is_silenced()
    ]
    try:
        problem = encryption_keys_check()
    except DatabaseError:  # unreachable, or not migrated yet: /readyz says which
        problem = None
    if problem:
        refusals.append(problem)
    return refusals


def bound_web_statements() -> None:
    """Each statement of a web request ends within ``DROPPORTAL_WEB_STATEMENT_TIMEOUT_MS``
    (the server cancels it; the request answers 503). Closes the connections the start-up
    checks opened: the next ones carry the bound, and gunicorn's ``--preload`` must not hand
    one socket to several forked workers."""
    options = connections["default"].settings_dict["OPTIONS"]
    bound = f"-c statement_timeout={settings.DROPPORTAL_WEB_STATEMENT_TIMEOUT_MS}"
    options["options"] = f"{options.get('options', '')} {bound}".strip()
    connections.close_all()
