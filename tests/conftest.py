"""Shared fixtures: a broker, API keys, an API client that sends a bearer key, and the
environment a ``manage.py`` subprocess needs to use the test database."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.core.cache import caches
from django.db import connection
from rest_framework.test import APIClient

from integrations.dispatch import signing
from integrations.models import Broker
from integrations.services import drop
from integrations.services.brokers import broker_create
from integrations.services.keys import CreatedApiKey, api_key_create

if TYPE_CHECKING:
    from tests.served_demo import ServedDemo


@pytest.fixture
def broker(db: None) -> Broker:
    return broker_create(broker_id="4821", name="Acme Data", mode="test", actor="test")


@pytest.fixture
def make_key(broker: Broker) -> Callable[..., CreatedApiKey]:
    def make(*scopes: str, for_broker: Broker | None = None) -> CreatedApiKey:
        return api_key_create(
            broker=for_broker or broker, scopes=list(scopes) or ["ingest"], actor="test"
        )

    return make


@pytest.fixture(autouse=True)
def staff_mfa_off_unless_marked(request: pytest.FixtureRequest, settings: Any) -> None:
    """Staff MFA is off in tests that are not about it.

    ``make test`` sets DATABASE_URL, which makes MFA required for every staff account (a real
    deployment): an admin or browser test about something else would meet the second step
    first. Tests marked ``@pytest.mark.staff_mfa`` (tests/admin/test_staff_mfa.py) keep the
    setting as the settings module made it, and prove it is on and enforced.
    """
    if request.node.get_closest_marker("staff_mfa") is None:
        settings.DROPPORTAL_STAFF_MFA_REQUIRED = False


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """Staff accounts are made and logged into in hundreds of tests: PBKDF2's deliberate
    slowness (a million rounds) would be most of their run time. No test is about the hash."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def api_client() -> APIClient:
    return APIClient()


def bearer(key: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture(autouse=True)
def drop_packages_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: Any) -> None:
    """Packages downloaded by a test's `drop pull` go to a temporary folder, not var/."""
    monkeypatch.setattr(drop, "PACKAGES_DIR", tmp_path_factory.mktemp("drop-packages"))


@pytest.fixture(autouse=True)
def fresh_callback_throttles() -> None:
    """Each test starts with no callback counted by the throttles (they are per process)."""
    caches[settings.CALLBACK_THROTTLE_CACHE].clear()


def database_url() -> str:
    """The test database as a libpq URL (also a DATABASE_URL), over TCP or a socket."""
    db = connection.settings_dict
    # Query parameters go to libpq as they are, so a socket directory (the embedded
    # server's HOST) works as well as a host name.
    params = {
        "host": db.get("HOST") or "127.0.0.1",
        "port": db.get("PORT") or 5432,
        "user": db.get("USER") or "",
        "password": db.get("PASSWORD") or "",
    }
    query = urlencode({k: v for k, v in params.items() if v})
    return f"postgres:///{db['NAME']}?{query}"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a ``manage.py`` subprocess that works on the test database (its
    tests must commit: ``django_db(transaction=True)``) with the same encryption and evidence
    keys."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        # Required with DATABASE_URL: the test process's own.
        "SECRET_KEY": settings.SECRET_KEY,
        "DROPPORTAL_ENCRYPTION_KEYS": ",".join(settings.DROPPORTAL_ENCRYPTION_KEYS),
        "DROPPORTAL_EVIDENCE_KEY": settings.DROPPORTAL_EVIDENCE_KEY,
        **extra,
    }


# A fixed time for the callbacks' signature clock, on a whole second.
SIGNATURE_CLOCK = 1_795_000_000.0


@pytest.fixture
def signature_clock(monkeypatch: pytest.MonkeyPatch) -> float:
    """Stop the clock that signs and checks callback timestamps (``dispatch.signing``) at
    ``SIGNATURE_CLOCK``: a timestamp's distance from the server's time is then exact, not
    whatever the wall clock moved between signing and checking."""
    from types import SimpleNamespace

    monkeypatch.setattr(signing, "time", SimpleNamespace(time=lambda: SIGNATURE_CLOCK))
    return SIGNATURE_CLOCK


@pytest.fixture(scope="session")
def demo(django_db_setup: None) -> Iterator[ServedDemo]:
    """``make demo`` run once in this test process and left serving (tests/served_demo.py):
    its story, its URL and its logins' password."""
    from tests.served_demo import served_demo

    with served_demo() as running:
        yield running
