"""The settings a process started with a given environment would read, evaluated in this
process: ``dropportal/settings.py`` run afresh, which takes a fraction of a process's start
(no app loading)::

    read = settings_started_with(subprocess_env(DROPPORTAL_BEHIND_TLS_PROXY="true"))
    read["SECURE_PROXY_SSL_HEADER"]

A refusal raises ``SystemExit`` with the line the process would print before exiting with
status 1. What ``dropportal.local_state`` reads at its import (``DROPPORTAL_VAR_DIR``) stays
this process's. Tests that must prove a real start keep a subprocess of their own.
"""

from __future__ import annotations

import os
import runpy
from collections.abc import Mapping
from typing import Any

from django.conf import settings

# Fixed for a running process, or never equal to a fresh evaluation's: Django prefixes
# STATIC_URL, fills DATABASES in and opened its connections; UNFOLD's entries are lambdas.
NOT_SWAPPED = frozenset({"DATABASES", "STATIC_URL", "UNFOLD"})


def settings_started_with(env: Mapping[str, str]) -> dict[str, Any]:
    """The upper-case names of ``dropportal/settings.py`` with ``env`` as the whole
    environment; ``os.environ`` is restored afterwards (the settings may add ``.env``'s)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        read = runpy.run_path(str(settings.BASE_DIR / "dropportal" / "settings.py"))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {name: value for name, value in read.items() if name.isupper()}


def start_with(live: Any, env: Mapping[str, str]) -> None:
    """Give this process (``live``: pytest-django's ``settings`` fixture, which restores them)
    the settings a start with ``env`` would read, where they differ from its own."""
    for name, value in settings_started_with(env).items():
        if name not in NOT_SWAPPED and getattr(settings, name, object()) != value:
            setattr(live, name, value)
