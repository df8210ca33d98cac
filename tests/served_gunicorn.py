"""The portal served by gunicorn as deployed (``dropportal.gunicorn_conf``, two workers), for
the tests that call it over plain sockets (``tests/raw_callbacks.py``)::

    with served_gunicorn(env, log, "--timeout", "5") as port:
        ...
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port


@contextmanager
def served_gunicorn(env: dict[str, str], log: Path, *args: str) -> Iterator[int]:
    """gunicorn on a free port with ``env`` and its output in ``log``, until it accepts
    connections; its port. Killed afterwards with its workers: nothing they would do on the
    way out is under test, and each Django process's exit takes a second of collection."""
    port = free_port()
    with log.open("w") as log_file:
        gunicorn = subprocess.Popen(  # noqa: S603
            [
                *(sys.executable, "-m", "gunicorn", "dropportal.wsgi"),
                *("--config", "python:dropportal.gunicorn_conf"),
                *("--bind", f"127.0.0.1:{port}", "--workers", "2", *args),
            ],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers are killed with it
        )
        try:
            deadline = time.monotonic() + 120
            while gunicorn.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            assert gunicorn.poll() is None, log.read_text()
            yield port
        finally:
            os.killpg(gunicorn.pid, signal.SIGKILL)
            gunicorn.wait(timeout=30)
