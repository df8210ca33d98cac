"""docs/deployment.md does what it says: its ``sh`` blocks run as written, its systemd
units pass ``systemd-analyze verify`` and their commands serve and work, its environment
file starts a process, its proxies point at the web unit and (run in front of the service)
show it the client's address, its Prometheus rules name only metrics that /metrics serves.
``text`` blocks need the target machine (systemd, cron)."""

from __future__ import annotations

import configparser
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from integrations.services.staff.keys import api_key_create
from tests.conftest import bearer, database_url
from tests.ports import free_port
from tests.tls import self_signed_certificate

GUIDE = Path(settings.BASE_DIR) / "docs" / "deployment.md"
CHECKOUT = "/opt/dropportal"
KNOWN_BLOCKS = {"sh", "text", "env", "ini", "caddy", "nginx", "yaml"}
PATIENCE_SECONDS = 120  # a bound for a stuck process, not a timing under test


def _blocks() -> list[tuple[str, str]]:
    text = GUIDE.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def _of(kind: str) -> list[str]:
    return [body for lang, body in _blocks() if lang == kind]


def test_every_block_is_of_a_kind_this_test_checks() -> None:
    kinds = [lang for lang, _ in _blocks()]
    assert set(kinds) <= KNOWN_BLOCKS, set(kinds) - KNOWN_BLOCKS
    assert {"sh", "env", "ini", "caddy", "nginx", "yaml"} <= set(kinds)


@pytest.fixture
def guide_database(transactional_db: None) -> str:
    """The guide's DATABASE_URL: the test database, which the processes its commands start
    reach (and whose rows go at the test's end, as every transactional test's). Migrated, as
    every test database is: the guide's ``migrate`` has nothing to apply, as on an upgrade
    that changes no model; migrating from empty is the suite's own start and
    tests/sql/test_sql_functions.py's. (A database of its own, a copy of the migrated
    template made and dropped for each test, was a second or two of the server's work.)"""
    return database_url()


def _deployment_env(url: str, tmp_path: Path) -> dict[str, str]:
    """The environment file of the guide, with this test's database, fresh secrets and
    temporary directories."""
    # The server's own programs first: the guide's pg_dump must be of the server's version
    # (the embedded server's are not the system's).
    with connection.cursor() as cursor:
        cursor.execute("SELECT setting FROM pg_config WHERE name = 'BINDIR'")
        (server_bin,) = cursor.fetchone()
    path = f"{Path(sys.executable).parent}:{server_bin}:{os.environ['PATH']}"
    env = {"PATH": path, "HOME": str(tmp_path)}
    (env_file,) = _of("env")
    for line in env_file.splitlines():
        name, _, value = line.partition("=")
        env[name] = value
    env.update(
        DATABASE_URL=url,
        SECRET_KEY="guide-" + "x" * 50,
        DROPPORTAL_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
        DROPPORTAL_EVIDENCE_KEY=ed25519.Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode(),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        DROPPORTAL_VAR_DIR=str(tmp_path / "var"),
        DROPPORTAL_ALLOWED_HOSTS="127.0.0.1,portal.example.com",
        BACKUP_DIR=str(tmp_path / "backups"),
    )
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "backups").mkdir()
    return env


def test_the_environment_file_names_only_documented_settings() -> None:
    readme = (Path(settings.BASE_DIR) / "README.md").read_text(encoding="utf-8")
    (env_file,) = _of("env")
    names = [line.partition("=")[0] for line in env_file.splitlines()]
    assert {
        "DATABASE_URL",
        "SECRET_KEY",
        "DROPPORTAL_ENCRYPTION_KEYS",
        "DROPPORTAL_EVIDENCE_KEY",
    } <= set(names)
    undocumented = [name for name in names if f"`{name}`" not in readme]
    assert not undocumented, f"not in the README's settings: {undocumented}"


def _run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        ["bash", "-c", f"set -euo pipefail; {command}"],  # noqa: S607
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_sh_commands_run_as_written(guide_database: str, tmp_path: Path) -> None:
    env = _deployment_env(guide_database, tmp_path)
    ran = []
    for block in _of("sh"):
        for command in block.strip().splitlines():
            done = _run(command, env)
            assert done.returncode == 0, f"{command}\n{done.stderr}"
            ran.append((command, done.stdout))
    outputs = dict(ran)
    secret, fernet_key, evidence_key = (outputs[c].strip() for c, _ in ran[:3])
    assert len(secret) >= 50
    Fernet(fernet_key.encode())  # a valid key
    # One line, as the environment file takes it; the setting turns each \n back into a break.
    assert "\n" not in evidence_key
    private_key = serialization.load_pem_private_key(
        evidence_key.replace("\\n", "\n").encode(), password=None
    )
    assert isinstance(private_key, ed25519.Ed25519PrivateKey)
    # Single-quoted in the environment file, a shell that sources it keeps the backslashes.
    (tmp_path / "evidence.env").write_text(f"DROPPORTAL_EVIDENCE_KEY='{evidence_key}'\n")
    sourced = _run(f'. {tmp_path}/evidence.env; printf %s "$DROPPORTAL_EVIDENCE_KEY"', env)
    assert sourced.stdout == evidence_key
    assert "dropportal-" in " ".join(p.name for p in (tmp_path / "backups").iterdir())
    assert any("metrics" in out for c, out in ran if "apikeys create" in c)


def _units() -> dict[str, configparser.ConfigParser]:
    units = {}
    for body in _of("ini"):
        first, _, rest = body.partition("\n")
        path = first.removeprefix("# ").strip()
        parser = configparser.ConfigParser(interpolation=None, strict=True)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(rest)
        units[path] = parser
    return units


def test_the_units_are_web_and_worker_on_the_environment_file() -> None:
    units = _units()
    assert set(units) == {
        "/etc/systemd/system/dropportal-web.service",
        "/etc/systemd/system/dropportal-worker.service",
    }
    for unit in units.values():
        service = unit["Service"]
        assert service["EnvironmentFile"] == "/etc/dropportal/dropportal.env"
        assert service["WorkingDirectory"] == CHECKOUT
        assert service["User"] == "dropportal"
        assert unit["Install"]["WantedBy"] == "multi-user.target"
    env_file = dict(line.partition("=")[::2] for line in _of("env")[0].splitlines())
    # The counters' directory is the one systemd makes for both units.
    for unit in units.values():
        assert f"/run/{unit['Service']['RuntimeDirectory']}" == env_file["PROMETHEUS_MULTIPROC_DIR"]


def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("SKIPPED LOUDLY: systemd-analyze is not installed; the units are unverified")
    paths = []
    for path, unit in _units().items():
        target = tmp_path / Path(path).name
        with target.open("w") as handle:
            unit.write(handle, space_around_delimiters=False)
        text = target.read_text().replace(CHECKOUT, str(settings.BASE_DIR))
        target.write_text(text)
        paths.append(str(target))
    verified = subprocess.run(  # noqa: S603
        ["systemd-analyze", "verify", "--man=no", *paths],  # noqa: S607
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stderr


def _exec_start(name: str, port: int) -> list[str]:
    command = _units()[f"/etc/systemd/system/{name}"]["Service"]["ExecStart"]
    command = command.replace(f"{CHECKOUT}/.venv/bin/", f"{Path(sys.executable).parent}/")
    return shlex.split(command.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_units_commands_serve_and_work(guide_database: str, tmp_path: Path) -> None:
    """ExecStart of both units, as written, with the environment file: the web answers
    /readyz 200 once the worker beats."""
    env = _deployment_env(guide_database, tmp_path)
    port = free_port()
    logs = [tmp_path / "web.log", tmp_path / "worker.log"]
    processes = [
        subprocess.Popen(  # noqa: S603
            _exec_start(unit, port),
            cwd=settings.BASE_DIR,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        for unit, log in zip(
            ("dropportal-web.service", "dropportal-worker.service"), logs, strict=True
        )
    ]
    try:
        deadline = time.monotonic() + PATIENCE_SECONDS
        while _status(f"http://127.0.0.1:{port}/readyz") != 200:
            assert all(p.poll() is None for p in processes), "a unit's command exited"
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.1)
        assert _status(f"http://127.0.0.1:{port}/healthz") == 200
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=60) for process in processes]
    assert codes == [0, 0]
    # The environment file asks for JSON logs: every line of both, gunicorn's included.
    assert env["DROPPORTAL_LOG_FORMAT"] == "json"
    lines = [line for log in logs for line in log.read_text().splitlines()]
    assert any('"gunicorn.access"' in line for line in lines)
    for line in lines:
        assert isinstance(json.loads(line), dict), line


def test_the_proxies_forward_to_the_web_unit() -> None:
    web = _units()["/etc/systemd/system/dropportal-web.service"]["Service"]["ExecStart"]
    bind = re.search(r"--bind (\S+)", web)
    assert bind is not None
    (caddy,) = _of("caddy")
    (nginx,) = _of("nginx")
    assert set(re.findall(r"reverse_proxy (\S+)", caddy)) == {bind.group(1)}
    assert set(re.findall(r"proxy_pass http://(\S+);", nginx)) == {bind.group(1)}
    for config in (caddy, nginx):
        assert config.count("{") == config.count("}")
        assert "portal.example.com" in config
    # Every nginx location that forwards tells the service who the client is (Caddy does it
    # by itself).
    for location in re.findall(r"location [^{]*\{[^}]*\}", nginx):
        if "proxy_pass" in location:
            assert "X-Forwarded-For $proxy_add_x_forwarded_for;" in location, location
            assert "X-Forwarded-Proto $scheme;" in location, location


@pytest.mark.parametrize(("program", "kind"), [("caddy", "caddy"), ("nginx", "nginx")])
def test_the_proxy_configurations_are_valid(program: str, kind: str, tmp_path: Path) -> None:
    if shutil.which(program) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{program} is missing: .ci/run installs it, and CI must check it")
        pytest.skip(
            f"SKIPPED LOUDLY: {program} is not installed here; its example is checked only "
            "for where it forwards (test_the_proxies_forward_to_the_web_unit)"
        )
    (config,) = _of(kind)
    path = tmp_path / f"{kind}.conf"
    if kind == "nginx":
        # nginx -t opens the certificate files: a throwaway pair stands in for the real ones.
        certificate, key = self_signed_certificate(tmp_path, "portal.example.com")
        config = re.sub(r"ssl_certificate (\S+);", f"ssl_certificate {certificate};", config)
        config = re.sub(r"ssl_certificate_key (\S+);", f"ssl_certificate_key {key};", config)
        path.write_text(f"events {{}}\nhttp {{\n{config}\n}}\n")
        check = [program, "-t", "-c", str(path)]
    else:
        path.write_text(config)
        check = [program, "validate", "--adapter", "caddyfile", "--config", str(path)]
    validated = subprocess.run(check, capture_output=True, text=True)  # noqa: S603
    assert validated.returncode == 0, validated.stderr


def _served_metric_names(client: APIClient, key: str) -> set[str]:
    text = client.get("/metrics", **bearer(key)).content.decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "counter":
                names.add(f"{name}_total")
    return names


@pytest.mark.django_db
def test_the_metrics_and_rules_name_only_served_metrics(api_client: APIClient) -> None:
    # The guide's key: the operator's, of every broker (a broker's sees its gauges only).
    operators = api_key_create(broker=None, scopes=["metrics"], actor="test").key
    served = _served_metric_names(api_client, operators)
    text = GUIDE.read_text(encoding="utf-8")
    table = set(re.findall(r"^\| `(dropportal_\w+)`", text, re.M))
    assert table
    assert table <= served, table - served
    config, rules = (yaml.safe_load(body) for body in _of("yaml"))
    job = config["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    named = {n for expr in expressions for n in re.findall(r"\bdropportal_\w+", expr)}
    assert named
    assert named <= served, named - served
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"alert", "expr", "annotations"} <= set(rule)


# -- behind the guide's proxies, the address the service sees is the client's ---------------

CLIENT = "127.0.0.2"  # the client's own address: loopback, but not the proxy's 127.0.0.1


def _nginx_in_front(config: str, port: int, upstream: str, directory: Path) -> list[str]:
    """The guide's TLS server block on ``port``, forwarding to ``upstream``."""
    (tls_server,) = [b for b in config.split("\nserver {") if "listen 443 ssl;" in b]
    certificate, key = self_signed_certificate(directory, "portal.example.com")
    tls_server = (
        tls_server.replace("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
        .replace("proxy_pass http://127.0.0.1:8000;", f"proxy_pass http://{upstream};")
        .replace("allow 10.0.0.0/8;", "allow 127.0.0.0/8;")  # the internal network, here
    )
    tls_server = re.sub(r"ssl_certificate (\S+);", f"ssl_certificate {certificate};", tls_server)
    tls_server = re.sub(r"ssl_certificate_key (\S+);", f"ssl_certificate_key {key};", tls_server)
    temp = " ".join(
        f"{kind}_temp_path {directory}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    path = directory / "nginx.conf"
    path.write_text(
        f"daemon off; pid {directory}/nginx.pid; error_log {directory}/error.log;\n"
        f"events {{}}\nhttp {{ access_log off; {temp}\nserver {{{tls_server}\n}}\n"
    )
    return ["nginx", "-p", str(directory), "-c", str(path)]


def _caddy_in_front(config: str, port: int, upstream: str, directory: Path) -> list[str]:
    """The guide's Caddy site on ``port`` (plain http: no certificate to fetch here)."""
    site = (
        config.replace(
            "portal.example.com {", f"http://portal.example.com:{port} {{\n\tbind 127.0.0.1", 1
        )
        .replace("reverse_proxy 127.0.0.1:8000", f"reverse_proxy {upstream}")
        .replace("remote_ip 10.0.0.0/8", "remote_ip 127.0.0.0/8")
    )
    path = directory / "Caddyfile"
    path.write_text("{\n\tadmin off\n\tauto_https off\n}\n" + site)
    return ["caddy", "run", "--adapter", "caddyfile", "--config", str(path)]


def _from_the_client(
    port: int, *, tls: bool, method: str, path: str, headers: dict[str, str], body: str = ""
) -> tuple[int, dict[str, str], str]:
    connection_class = http.client.HTTPSConnection if tls else http.client.HTTPConnection
    # The proxy's certificate is the throwaway self-signed one of this test.
    unverified = ssl._create_unverified_context()  # noqa: S323
    extra: dict[str, Any] = {"context": unverified} if tls else {}
    conn = connection_class("127.0.0.1", port, timeout=30, source_address=(CLIENT, 0), **extra)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
@pytest.mark.django_db(transaction=True)
def test_behind_the_guides_proxy_the_lockout_counts_the_clients_address(
    kind: str, tmp_path: Path, live_server: Any, settings: Any
) -> None:
    """A wrong password sent through the proxy, as written, to a service configured by the
    environment file: the lockout records the client's address, not the proxy's, even when
    the client forges X-Forwarded-For."""
    if shutil.which(kind) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{kind} is missing: .ci/run installs it, and CI must check it")
        pytest.skip(f"SKIPPED LOUDLY: {kind} is not installed; the proxy's address is unproven")
    from axes.models import AccessAttempt
    from django.contrib.auth.models import User

    env_file = dict(line.partition("=")[::2] for line in _of("env")[0].splitlines())
    assert env_file["DROPPORTAL_BEHIND_TLS_PROXY"] == "true"
    settings.DROPPORTAL_BEHIND_TLS_PROXY = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "portal.example.com"]
    User.objects.create_user("ann", password="right-password-123", is_staff=True)

    port, upstream = free_port(), live_server.url.removeprefix("http://")
    (config,) = _of(kind)
    build = _nginx_in_front if kind == "nginx" else _caddy_in_front
    command = build(config, port, upstream, tmp_path)
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)}
    proxy = subprocess.Popen(  # noqa: S603
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    tls = kind == "nginx"
    host = {"Host": "portal.example.com"}
    try:
        deadline = time.monotonic() + PATIENCE_SECONDS
        while True:
            assert proxy.poll() is None, f"{kind} exited: {command}"
            try:
                status, headers, page = _from_the_client(
                    port, tls=tls, method="GET", path="/admin/login/", headers=host
                )
                break
            except OSError:
                assert time.monotonic() < deadline, f"{kind} never listened"
                time.sleep(0.2)
        assert status == 200, page[:500]
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        cookie = re.search(r"csrftoken=([^;]+)", headers.get("Set-Cookie", ""))
        assert token and cookie
        scheme = "https" if tls else "http"
        status, _, _ = _from_the_client(
            port,
            tls=tls,
            method="POST",
            path="/admin/login/",
            headers={
                **host,
                "Cookie": f"csrftoken={cookie.group(1)}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Referer": f"{scheme}://portal.example.com/admin/login/",
                "X-Forwarded-For": "203.0.113.66",  # the client's own claim
            },
            body=urllib.parse.urlencode(
                {
                    "csrfmiddlewaretoken": token.group(1),
                    "username": "ann",
                    "password": "wrong-guess",
                }
            ),
        )
        assert status == 200  # the form again, with its error
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=60)
    assert list(AccessAttempt.objects.values_list("username", "ip_address")) == [("ann", CLIENT)]
