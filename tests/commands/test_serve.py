"""``manage.py serve``, what ``make run`` calls: gunicorn and a worker until Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, ManagementUtility, call_command

from integrations.management.commands import serve as serve_command
from integrations.models import Broker
from integrations.services.staff.keys import api_key_create
from tests.conftest import subprocess_env
from tests.ports import free_port


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _session_commands(session: int) -> list[str]:
    """The command lines of the processes in ``session`` (Linux /proc)."""
    commands = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After the command name: state, ppid, pgrp, session.
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == session:
                cmdline = (stat.parent / "cmdline").read_bytes()
                commands.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
    return commands


def test_a_port_in_use_is_refused_in_one_line_before_anything_starts(held_port: int) -> None:
    with pytest.raises(CommandError, match=rf"cannot serve on 127.0.0.1:{held_port}: .*--bind"):
        call_command("serve", bind=f"127.0.0.1:{held_port}")


@pytest.mark.parametrize("port", ["99999", "65536", "0"])
def test_a_port_out_of_range_is_refused_in_one_line_before_anything_starts(port: str) -> None:
    with pytest.raises(CommandError, match=rf"^--bind: the port must be 1 to 65535, not {port}$"):
        call_command("serve", bind=f"127.0.0.1:{port}")


@pytest.mark.parametrize("port", ["-1", "+80", "8_000", "\u0668\u0660\u0660\u0660", "80 "])
def test_a_port_not_written_in_ascii_digits_is_refused_in_one_line(port: str) -> None:
    # int() reads all of these; gunicorn would be handed the --bind as written.
    with pytest.raises(CommandError, match=r"^--bind takes host:port, not "):
        call_command("serve", bind=f"127.0.0.1:{port}")


def test_a_port_held_on_an_ipv6_address_is_refused_as_in_use() -> None:
    """``[::1]:PORT`` is the address gunicorn binds: a port held there is refused as in use,
    not as an address an IPv4 socket cannot resolve."""
    with socket.socket(socket.AF_INET6) as holder:
        holder.bind(("::1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        with pytest.raises(CommandError, match=rf"cannot serve on \[::1\]:{port}: .*in use"):
            call_command("serve", bind=f"[::1]:{port}")


def test_a_bad_argument_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["manage.py", "serve", "--web-workers", "two"]
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(argv).fetch_command("serve").run_from_argv(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "manage.py serve: error: argument --web-workers: invalid int value: 'two'\n"
    )


def test_off_loopback_the_embedded_database_is_refused_in_one_line(settings) -> None:
    # The embedded database (no DATABASE_URL): MFA is optional, so the admin must stay local.
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False
    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example.com"
    for everywhere in ("0.0.0.0:8000", ":8000", "[::]:8000"):  # ":8000": gunicorn's every address
        with pytest.raises(CommandError, match=r"^refusing to serve on .*DATABASE_URL"):
            call_command("serve", bind=everywhere)


def test_off_loopback_a_plain_http_public_url_exits_non_zero_in_one_line() -> None:
    # DATABASE_URL is set (MFA required) but the public URL is the default, plain http on
    # loopback (which start-up's own check lets through): the network would see it in clear.
    refused = subprocess.run(
        [sys.executable, "manage.py", "serve", "--bind", "0.0.0.0:8000"],
        cwd=settings.BASE_DIR,
        env={k: v for k, v in subprocess_env().items() if k != "DROPPORTAL_PUBLIC_URL"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0
    assert refused.stderr.strip().startswith("CommandError: refusing to serve on 0.0.0.0:8000")
    assert "https DROPPORTAL_PUBLIC_URL" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_off_loopback_with_mfa_and_https_goes_on_to_bind(settings, held_port: int) -> None:
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = True
    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example.com"
    # Past the check: the next refusal is the port held on every address of this machine.
    with pytest.raises(CommandError, match=rf"cannot serve on 0.0.0.0:{held_port}: "):
        call_command("serve", bind=f"0.0.0.0:{held_port}")


def _resolving(monkeypatch: pytest.MonkeyPatch, names: dict[str, list[str]]) -> None:
    """Host names resolving to the given addresses (no resolver asked); others fail."""

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in names[host]
        ]

    monkeypatch.setattr(serve_command.socket, "getaddrinfo", getaddrinfo)


def test_a_bind_name_is_judged_by_every_address_it_resolves_to(
    settings, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False  # the embedded database: loopback only
    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example.com"
    # The real localhost (from /etc/hosts): loopback, so on to bind the port held there.
    with pytest.raises(CommandError, match=rf"^cannot serve on localhost:{held_port}: "):
        call_command("serve", bind=f"localhost:{held_port}")

    _resolving(
        monkeypatch,
        {
            "localhost": ["127.0.0.1", "192.0.2.10"],  # a hosts file that adds a LAN address
            "dev-box.internal": ["127.0.0.1", "::1"],
        },
    )
    # (Each on the held port: a check that let one through would stop there, not serve.)
    with pytest.raises(CommandError, match=rf"^refusing to serve on localhost:{held_port}: "):
        call_command("serve", bind=f"localhost:{held_port}")
    # Not read as loopback by its name, but resolved to loopback only: past the check.
    with pytest.raises(CommandError, match=rf"^cannot serve on dev-box.internal:{held_port}: "):
        call_command("serve", bind=f"dev-box.internal:{held_port}")
    with pytest.raises(CommandError, match=r"^--bind: cannot resolve 'portal.localhost'"):
        call_command("serve", bind=f"portal.localhost:{held_port}")


def _get(url: str, **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_serve_answers_on_its_port_with_a_worker_and_ctrl_c_stops_both(
    tmp_path: Path, broker: Broker
) -> None:
    port = free_port()
    # The operator's key (no broker): the process counters are the service's, not a broker's.
    metrics_key = api_key_create(broker=None, scopes=["metrics"], actor="test").key
    serve = subprocess.Popen(  # noqa: S603
        [sys.executable, "manage.py", "serve", "--bind", f"127.0.0.1:{port}", "--web-workers", "2"],
        cwd=settings.BASE_DIR,
        env=subprocess_env(
            DJANGO_SUPERUSER_USERNAME="ops",
            DJANGO_SUPERUSER_PASSWORD="pw-1",
            PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert serve.stdout is not None
        announced = ""
        deadline = time.monotonic() + 120
        while "is serving" not in announced and time.monotonic() < deadline:
            announced = serve.stdout.readline()
            assert announced or serve.poll() is None, "serve exited before serving"
        assert f"http://127.0.0.1:{port}/admin/" in announced
        # The web server's access log goes on to the same pipe: read it to the end, or a
        # full pipe would block the web server (and its stopping) on a write.
        threading.Thread(target=serve.stdout.read, daemon=True).start()

        # Announced only once the web server answers: no key is a problem-details 401. The
        # first request loads the whole app, which takes seconds on a loaded machine: the
        # timeout only stops a hang.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/ping", timeout=120)
        assert refused.value.code == 401
        assert refused.value.headers["Content-Type"] == "application/problem+json"
        assert any("manage.py worker" in c for c in _session_commands(serve.pid))

        base = f"http://127.0.0.1:{port}"
        assert _get(f"{base}/healthz") == (200, b'{"status": "ok"}')
        # Ready once the worker has beaten (it started with the web server).
        deadline = time.monotonic() + 120
        while _get(f"{base}/readyz")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(_get(f"{base}/readyz")[1])["ready"] is True
        # Callbacks answered by both web processes add up in one scrape (multi-process).
        for _ in range(6):
            status, _body = _get(f"{base}/api/v1/drop/callbacks/deletion")
            assert status in (401, 405)
        status, text = _get(f"{base}/metrics", Authorization=f"Bearer {metrics_key}")
        assert status == 200
        counted = [
            float(line.rsplit(" ", 1)[1])
            for line in text.decode().splitlines()
            if line.startswith("dropportal_callbacks_total{") and 'endpoint="deletion"' in line
        ]
        assert sum(counted) == 6
        # Counted in the shared directory (whichever process answered), not in one process.
        assert list((tmp_path / "prometheus").glob("counter_*.db"))
        assert "dropportal_ledger_events_total" in text.decode()
    finally:
        serve.send_signal(signal.SIGINT)  # as Ctrl-C does
        try:
            serve.wait(timeout=60)  # serve itself gives its processes 20 s, then kills them
        except subprocess.TimeoutExpired:
            pytest.fail(f"serve still running 60 s after Ctrl-C: {_session_commands(serve.pid)}")
        finally:
            if serve.poll() is None:
                os.killpg(serve.pid, signal.SIGKILL)

    assert serve.returncode == 0
    with socket.socket() as probe:  # gunicorn let go of the port
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


def test_stopping_kills_and_reaps_what_ignores_sigterm_past_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serve_command, "STOP_SECONDS", 1.0)
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print(flush=True); time.sleep(60)"
    )
    polite = "import time; print(flush=True); time.sleep(60)"
    processes = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)  # noqa: S603
        for code in (stubborn, polite, stubborn)
    ]
    for p in processes:  # each has set its signals up
        assert p.stdout is not None
        p.stdout.readline()
    serve_command._stop(processes)
    assert [p.returncode for p in processes] == [-signal.SIGKILL, -signal.SIGTERM, -signal.SIGKILL]
    for p in processes:
        assert p.stdout is not None
        p.stdout.close()
