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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first, so that the workers (pytest-xdist) end together instead of
    one running a long test alone at the end.

    This runs before pytest-django's own ordering (a conftest's hook before a plugin's),
    which is a stable sort by database use: the slow tests lead each of its groups. ``make
    test`` lets an idle worker take tests queued for another (``--dist worksteal``), so a test
    in a transaction may run after one that flushed the database: ``roles_survive_a_flush``.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def roles_survive_a_flush(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The staff roles are groups that migrations make, which a transactional test's flush
    empties; pytest-xdist's work stealing can then hand this process a test that needs them.
    A flush ends with post_migrate: the roles are put back then, as the migrations left them.
    """
    from django.apps import apps
    from django.contrib.auth.models import Group, Permission
    from django.db.models.signals import post_migrate

    with django_db_blocker.unblock():
        roles = {
            group.name: [
                (p.content_type.app_label, p.codename)
                for p in group.permissions.select_related("content_type")
            ]
            for group in Group.objects.all()
        }
    last_app = list(apps.get_app_configs())[-1]  # its post_migrate comes last

    def restore(sender: Any, using: str, **kwargs: Any) -> None:
        if sender is not last_app or Group.objects.using(using).exists():
            return
        for name, held in roles.items():
            group = Group.objects.using(using).create(name=name)
            permissions = Permission.objects.using(using).filter(
                content_type__app_label__in={app for app, _ in held},
                codename__in={codename for _, codename in held},
            )
            group.permissions.add(
                *(
                    p
                    for p in permissions.select_related("content_type")
                    if (p.content_type.app_label, p.codename) in held
                )
            )

    post_migrate.connect(restore, weak=False, dispatch_uid="tests.roles_survive_a_flush")
    yield
    post_migrate.disconnect(dispatch_uid="tests.roles_survive_a_flush")


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
