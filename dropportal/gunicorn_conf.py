"""gunicorn's settings for dropportal, what ``manage.py serve`` passes and a deployment
should too::

    gunicorn dropportal.wsgi -c python:dropportal.gunicorn_conf --bind 127.0.0.1:8000

With ``PROMETHEUS_MULTIPROC_DIR`` set, each web process keeps its counters in that directory
and ``/metrics`` adds them up; a process that exits is marked dead so its live figures go.
With ``DROPPORTAL_LOG_FORMAT=json``, gunicorn's own lines are JSON too.

Before any worker starts, the master refuses to start as ``manage.py`` would (the settings'
refusals, the system checks' errors such as ``dropportal.E001``, encryption keys that cannot
read the stored secrets), in one line each; ``dropportal.wsgi`` checks the same for a
gunicorn started without this file.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Threads, so that a worker takes every connection off the listening socket as it comes
# instead of leaving it unanswered in the kernel's accept queue, and a bounded queue for them:
# what it cannot serve in time is answered 503 with Retry-After at once
# (dropportal/gunicorn_worker.py). Four threads a worker: more would not record callbacks
# faster (Python's CPU is the limit), and each thread holds a database connection.
worker_class = "dropportal.gunicorn_worker.ShedWorker"
threads = 4
# gunicorn's defaults, said here: connections taken per worker before the rest wait in the
# kernel's accept queue, and that queue's length (the kernel caps it at net.core.somaxconn).
worker_connections = 1000
backlog = 2048
# gunicorn's default. With threads it watches each worker's main loop, not its requests: a
# request waiting on PostgreSQL is bounded by the settings instead (connect 5 s, TCP 25 s,
# a web statement 20 s), which answer it 503.
timeout = 30


def on_starting(server: Any) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    import django

    from dropportal.setting_up import collector_paused

    with collector_paused():
        django.setup()  # settings.py exits in one line on a missing secret
        from django.db import connections

        from dropportal.startup import start_refusals

        refusals = start_refusals()
    connections.close_all()  # the workers open their own after the fork
    if refusals:
        sys.exit("\n".join(f"error: {refusal}" for refusal in refusals))


def child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


if os.environ.get("DROPPORTAL_LOG_FORMAT") == "json":
    _json = {
        "()": "pythonjsonlogger.json.JsonFormatter",
        "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
        "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
    }
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": _json},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "json"},
        },
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": ["console"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": ["console"], "propagate": False},
        },
    }
