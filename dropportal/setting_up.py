"""The cyclic garbage collector while a process sets up: the settings and every app's models
and admin (``manage.py``, until its command is looked up), and for a web process its start
checks too (``dropportal/wsgi.py``, gunicorn's ``on_starting``)::

    with collector_paused():   # or pause() ... resume()
        django.setup()

Setting up makes objects that live as long as the process, and next to no garbage: the
collector's passes over them, again and again as they pile up, were a fifth to a quarter of a
command's CPU (``manage.py check``, ``brokers list``). It is off meanwhile; what set-up made is
then frozen (``gc.freeze``): out of every later pass, and of the one at exit. (Python's
documentation describes the same for a process that forks, as gunicorn's master does: its
workers then leave the pages of those objects shared.) A reference cycle made while setting
up and dropped later is never collected; objects freed by their reference counts are freed as
ever. A collector that was off already (the caller's choice) is left as it was.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_paused = False


def pause() -> None:
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False


@contextmanager
def collector_paused() -> Iterator[None]:
    pause()
    try:
        yield
    finally:
        resume()
