"""Settings of ``bench_callbacks.py``'s server: the product's, plus the bench-only bare view.

Not used by the product; the bench starts gunicorn with ``DJANGO_SETTINGS_MODULE`` set to
this module and ``bench/`` on the Python path.
"""

from dropportal.settings import *  # noqa: F403

ROOT_URLCONF = "callbacks_urls"
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
# The bench reads each database connection's CPU from /proc around a round; a connection
# recycled mid-round (the product's 60 s) would take its CPU with it.
DATABASES["default"]["CONN_MAX_AGE"] = None  # noqa: F405
