"""``manage.py serve`` (what ``make run`` calls): set up, then serve the admin and API with
gunicorn on 127.0.0.1:8000 together with one job worker; Ctrl-C stops both.

The web processes and the worker share their Prometheus counters through
``PROMETHEUS_MULTIPROC_DIR`` (``var/prometheus`` unless set), emptied at each start.

Off loopback (``--bind 0.0.0.0:8000``; a host name is resolved and is loopback only when
every address it resolves to is) it serves only when every staff login needs a second
factor (``DATABASE_URL`` set) and ``DROPPORTAL_PUBLIC_URL`` is https: on the embedded database
MFA is optional, and plain http would carry passwords and session cookies in clear.

First run only: migrates, collects static files, and creates a staff login (from
``DJANGO_SUPERUSER_USERNAME``/``DJANGO_SUPERUSER_PASSWORD`` if set, else ``admin`` with a
generated password printed once).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from integrations.ascii_integers import ascii_integer
from integrations.client_address import is_loopback_host
from integrations.management.base import one_line_errors, refuse_unreadable_secrets

_CLEAN = (0, -signal.SIGTERM, -signal.SIGINT)
STOP_SECONDS = 20.0  # for the web server and the worker together, after SIGTERM


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _host_port(bind: str) -> tuple[str, int]:
    """``--bind``'s host, as the socket takes it (an IPv6 address without its brackets), and
    port. A port outside 1-65535 is refused here: ``socket.bind`` would raise
    ``OverflowError``, a traceback, and port 0 would serve on a port no one is told."""
    host, _, port = bind.rpartition(":")
    number = ascii_integer(port)  # not "+80", "8_000" or another script's digits
    if number is None:
        raise CommandError(f"--bind takes host:port, not {bind!r}")
    if not 1 <= number <= 65535:
        raise CommandError(f"--bind: the port must be 1 to 65535, not {number}")
    return host.strip("[]") or "127.0.0.1", number


def _only_loopback(host: str, port: int) -> bool:
    """Whether every address ``host`` stands for is loopback: a name is resolved (as
    gunicorn will resolve it), and judged by all it resolves to, not by how it reads."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise CommandError(f"--bind: cannot resolve {host!r}: {exc}") from None
        addresses = {str(info[4][0]) for info in found}
        return bool(addresses) and all(is_loopback_host(a.split("%")[0]) for a in addresses)
    return is_loopback_host(host)


def _refuse_if_open_without_mfa_and_https(bind: str) -> None:
    _, port = _host_port(bind)  # a malformed --bind is refused as such
    host = bind.rpartition(":")[0].strip("[]")  # as gunicorn reads it: "" is every address
    if host and _only_loopback(host, port):
        return
    https = urlsplit(settings.DROPPORTAL_PUBLIC_URL).scheme == "https"
    if settings.DROPPORTAL_STAFF_MFA_REQUIRED and https:
        return
    raise CommandError(
        f"refusing to serve on {bind}: off loopback the admin needs two-factor authentication "
        "for every staff login (set DATABASE_URL) and an https DROPPORTAL_PUBLIC_URL; "
        "or pass --bind 127.0.0.1:8000"
    )


def _refuse_if_taken(bind: str) -> None:
    host, port = _host_port(bind)
    # An IPv6 address ([::1]:8000) as gunicorn binds it: an IPv4 socket cannot take it.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CommandError(
                f"cannot serve on {bind}: {exc.strerror}; stop what holds it or pass --bind"
            ) from None


def _listening(bind: str, *, web: subprocess.Popen[bytes], timeout: float = 60) -> bool:
    """Whether the web server took ``bind`` (host:port) before it exited or ``timeout``."""
    address = _host_port(bind)
    deadline = time.monotonic() + timeout
    while web.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(address, timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every process at once, then one deadline for all: stopping takes as long
    as the slowest, not the sum. What is still running then is killed."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    for p in processes:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Command(BaseCommand):
    help = "Set up and serve dropportal (web + one worker) until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        one_line_errors(parser)
        parser.add_argument("--bind", default="127.0.0.1:8000")
        parser.add_argument("--web-workers", type=int, default=2)

    def handle(self, *args: Any, **options: Any) -> None:
        _refuse_if_open_without_mfa_and_https(options["bind"])
        _refuse_if_taken(options["bind"])
        call_command("migrate", interactive=False, verbosity=0)
        refuse_unreadable_secrets()
        call_command("collectstatic", interactive=False, verbosity=0)
        self._ensure_staff_login()
        base = [sys.executable]
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self._metrics_directory())}
        processes = [
            subprocess.Popen(  # noqa: S603
                [
                    *base,
                    "-m",
                    "gunicorn",
                    "dropportal.wsgi",
                    "--config",
                    "python:dropportal.gunicorn_conf",
                    "--bind",
                    options["bind"],
                    "--workers",
                    str(options["web_workers"]),
                    "--access-logfile",
                    "-",
                ],
                env=env,
            ),
            subprocess.Popen(  # noqa: S603
                [*base, "manage.py", "worker"], cwd=settings.BASE_DIR, env=env
            ),
        ]
        signal.signal(signal.SIGTERM, _interrupt)  # stop the same way on SIGTERM as on Ctrl-C
        try:
            if _listening(options["bind"], web=processes[0]):
                self.stdout.write(
                    f"dropportal is serving http://{options['bind']}/admin/ and "
                    f"http://{options['bind']}/api/v1/ with one worker. Ctrl-C stops."
                )
            while all(p.poll() is None for p in processes):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            _stop(processes)
        names = ("web server", "worker")
        failed = [n for n, p in zip(names, processes, strict=True) if p.returncode not in _CLEAN]
        if failed:
            self.stderr.write(f"stopped: the {' and the '.join(failed)} exited with an error")
            sys.exit(1)

    def _metrics_directory(self) -> Path:
        """The processes' shared Prometheus counters (multi-process mode), empty at start:
        the files of processes gone with a previous run would count again."""
        given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        directory = Path(given) if given else settings.DROPPORTAL_VAR_DIR / "prometheus"
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
        return directory

    def _ensure_staff_login(self) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin")
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD") or secrets.token_urlsafe(12)
        email = os.environ.get("DJANGO_SUPERUSER_EMAIL", "")
        User.objects.create_superuser(username=username, email=email, password=password)
        if "DJANGO_SUPERUSER_PASSWORD" in os.environ:
            self.stdout.write(f"Created staff login {username!r} with DJANGO_SUPERUSER_PASSWORD.")
        else:
            self.stdout.write(
                f"Created staff login: user {username!r}, password {password!r} "
                "(shown only this once; change it in the admin)."
            )
