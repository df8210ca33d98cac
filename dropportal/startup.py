"""What stops a web process at start, as ``manage.py`` commands are stopped::

    for line in start_refusals(): ...   # one line each; none: start

The system checks' errors (``dropportal.E001`` among them; warnings are left to
``manage.py check``) and ``DROPPORTAL_ENCRYPTION_KEYS`` unable to read the stored secrets. An
unreachable database stops nothing: the process answers 503 until it is back.
"""

from __future__ import annotations

from django.core import checks
from django.db import DatabaseError

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
