"""What stops a web process at start, as ``manage.py`` commands are stopped::

    for line in start_refusals(): ...   # one line each; none: start

The system checks' errors (``dropportal.E001`` among them) and ``DROPPORTAL_ENCRYPTION_KEYS``
unable to read the stored secrets. An unreachable database stops nothing: the process
answers 503 until it is back. Our own warnings (``dropportal.W001``: private targets allowed,
``dropportal.W002``: a plain-http public URL allowed, ``dropportal.W003``: alert recipients
with no mail server) stop nothing but are logged, one WARNING line each at every start: a
setting that opens a door, or one that does nothing, is never on quietly.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections

from integrations.services.staff.secrets import encryption_keys_check

logger = logging.getLogger(__name__)


def _line(message: checks.CheckMessage) -> str:
    return f"{message.msg} ({message.id}{'; ' + message.hint if message.hint else ''})"


def start_refusals() -> list[str]:
    found = [m for m in checks.run_checks(include_deployment_checks=False) if not m.is_silenced()]
    for message in found:
        if message.level == checks.WARNING and str(message.id).startswith("dropportal.W"):
            logger.warning("%s", _line(message))
    refusals = [_line(message) for message in found if message.is_serious()]
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
