"""Shared fixtures: a broker, API keys, an API client that sends a bearer key, and the
environment a ``manage.py`` subprocess needs to use the test database."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.core.cache import caches
from django.db import connection, connections
from django.http import HttpRequest
from django.template.base import Template
from django.test import Client, TestCase, override_settings
from django.test import utils as test_utils
from django.test.testcases import QuietWSGIRequestHandler
from django.test.utils import _TestState
from moto.server import ThreadedMotoServer
from rest_framework.test import APIClient
from whitenoise.middleware import WhiteNoiseMiddleware

from devtools.databases import database_drop, database_recreate, demo_database_name
from devtools.drop_simulator import DropSimulator
from devtools.tsa_simulator import TsaSimulator
from integrations.dispatch import signing
from integrations.models import Broker
from integrations.services.cycle import drop as drop_service
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import CreatedApiKey, api_key_create
from tests.builders import MIGRATED_TABLES, tables_empty, worker_sessions_end

if TYPE_CHECKING:
    from tests.served_demo import ServedDemo


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal delivers it, to this process and to the ones tests start (the
    demo, ``serve``): a suite started as a script's background job inherits SIGINT ignored,
    which Python keeps, and so would every child. With a handler here, a child starts with
    SIGINT at its default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The live server writes an answer's headers and its body apart: with Nagle's algorithm
    # the body waits for the client's delayed ACK of the headers, 40 ms on every request.
    QuietWSGIRequestHandler.disable_nagle_algorithm = True
    WhiteNoiseMiddleware.update_files_dictionary = _static_files_read_once  # type: ignore[method-assign]
    Client._login = _login_without_a_spare_session  # type: ignore[attr-defined]


def _login_without_a_spare_session(self: Client, user: Any, backend: str | None = None) -> None:
    """``Client.force_login`` as Django's own, without the session it saves first: its
    ``self.session`` saves an empty session for a client with no cookie, and ``login()`` then
    replaces it at once with a new key (a row inserted, read and deleted: 6 of a login's 18
    queries, and hundreds of tests log in). ``login()`` itself, its signals and the saved
    session are the same."""
    from django.contrib.auth import login

    request = HttpRequest()
    cookie = self.cookies.get(settings.SESSION_COOKIE_NAME)
    store = import_module(settings.SESSION_ENGINE).SessionStore
    request.session = store(cookie.value if cookie else None)
    login(request, user, backend)
    request.session.save()
    self._set_login_cookies(request)  # type: ignore[attr-defined]


_read_static_files = WhiteNoiseMiddleware.update_files_dictionary
_static_files: dict[tuple[Any, ...], dict[str, Any]] = {}


def _static_files_read_once(self: WhiteNoiseMiddleware, root: str, prefix: str) -> None:
    """Django's test client loads the middleware anew for every ``Client``, and WhiteNoise's
    stats every collected static file and its compressed copies as it loads: a cost that
    production pays once per process and the tests paid in nearly every test. The directory
    is read once per process and per settings WhiteNoise is made from (a test that changes
    one of those gets a reading of its own); no test serves a static file through the client."""
    key = (
        root,
        prefix,
        *(
            (name, repr(getattr(settings, name)))
            for name in sorted(dir(settings))
            if name.startswith(("WHITENOISE_", "STATIC", "STORAGES", "DEBUG", "FORCE_SCRIPT"))
        ),
    )
    if key not in _static_files:
        found, self.files = self.files, {}
        try:
            _read_static_files(self, root, prefix)
            _static_files[key] = self.files
        finally:
            self.files = {**found, **self.files}
    else:
        self.files.update(_static_files[key])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` lead the run, shared out so that the workers (pytest-xdist)
    end together instead of one running a long test alone at the end.

    ``make test`` splits the queue into one block per worker, and an idle worker takes tests
    from the end of another's (``--dist worksteal``): each block starts with its share of the
    slow tests, dealt in turn, those on the demo's data as one (one worker runs the demo).

    This runs after pytest-django's own ordering, a sort by database use that keeps a test in
    a transaction from following a flush on the same process; work stealing breaks that
    promise anyway: ``django_db_setup`` (below) keeps what it was for.
    """
    # The demo names its database after the test database: a run of demo tests alone must
    # still set one up (pytest-django sets up only what a collected test asks for).
    for item in items:
        if "demo" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.django_db)
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    slow: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        (slow if item.get_closest_marker("slow") else rest).append(item)
    on_the_demo = [item for item in slow if "demo" in getattr(item, "fixturenames", ())]
    units = [on_the_demo, *([item] for item in slow if item not in on_the_demo)]
    blocks: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for index, unit in enumerate(unit for unit in units if unit):
        blocks[index % workers].extend(unit)
    size, extra = divmod(len(items), workers)
    ordered: list[pytest.Item] = []
    for index, block in enumerate(blocks):
        # A block of slow tests larger than its share takes nothing more (a negative
        # slice would repeat the rest's tests in the next block: run twice).
        wanted = max(size + (index < extra) - len(block), 0)
        ordered += block + rest[:wanted]
        rest = rest[wanted:]
    items[:] = ordered + rest


ROOT = Path(__file__).resolve().parents[1]
# The test database's name, its template's, and whether it was copied from it.
TEST_DATABASE = pytest.StashKey[tuple[str, str, bool]]()


def migrations_fingerprint() -> str:
    """What the migrations would make of an empty database: every migration package's files
    (their SQL too), the model code they import and the installed apps. (They write no
    encrypted row: the keys play no part.)"""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    folders = {
        Path(str(sys.modules[m.__module__].__file__)).parent
        for m in loader.disk_migrations.values()
    }
    folders |= {ROOT / "integrations" / "models", ROOT / "integrations" / "sql"}
    digest = hashlib.sha256(repr(settings.INSTALLED_APPS).encode())
    for folder in sorted(folders):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                # Named from its app's folder: two checkouts of the same code share a template.
                name = path.relative_to(folder.parent.parent).as_posix()
                digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def template_name() -> str:
    """The migrated database a test database is copied from, one per state of the migrations
    (named after the database settings name before a test database replaces it)."""
    return f"test_{settings.DATABASES['default']['NAME']}_migrated_{migrations_fingerprint()}"[-63:]


def migrated_template(config: pytest.Config) -> str | None:
    """The name of the migrated database test databases are copied from, if there is one."""
    template = config.stash[TEST_DATABASE][1]
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT FROM pg_database WHERE datname = %s", [template])
        return template if cursor.fetchone() is not None else None


def checkout_tag() -> str:
    """Six hex digits naming this checkout (its path): two checkouts' suites on one server
    (a helper's worktree beside the main one) would otherwise share the workers' database
    names and drop each other's databases."""
    return hashlib.sha256(str(ROOT).encode()).hexdigest()[:6]


@pytest.fixture(scope="session")
def django_db_modify_db_settings(request: pytest.FixtureRequest) -> None:
    """The test database is ``test_<name>_<checkout tag>``, with pytest-django's worker
    suffix after it (``_gw0``, ...); its template stays shared by every checkout."""
    database = settings.DATABASES["default"]
    # PostgreSQL cuts names at 63 bytes: leave room for the tag and the worker's suffix.
    name = f"test_{database['NAME']}"[:50]
    database.setdefault("TEST", {})["NAME"] = f"{name}_{checkout_tag()}"
    request.getfixturevalue("django_db_modify_db_settings_parallel_suffix")


@pytest.fixture(scope="session")
def django_db_keepdb(
    request: pytest.FixtureRequest,
    django_db_keepdb: bool,
    django_db_modify_db_settings: None,
    django_db_blocker: Any,
) -> bool:
    """The test database is a copy of a migrated template when there is one: ``CREATE
    DATABASE ... TEMPLATE`` takes a moment where migrating takes most of a worker's start.

    Django is then told to keep the database it finds (``keepdb``): it runs ``migrate``, which
    has nothing to apply, and its post-migrate handlers, which have nothing to add. The first
    run after a migration changed migrates as before, and leaves its database as the template
    (``django_db_setup`` below). ``--reuse-db`` keeps its own meaning: then nothing is copied.
    """
    test_name, template = connection.creation.test_db_signature()[-1], template_name()
    request.config.stash[TEST_DATABASE] = (test_name, template, False)
    if django_db_keepdb:
        return True
    with django_db_blocker.unblock():
        if migrated_template(request.config) is None:
            return False
        with connection._nodb_cursor() as cursor:
            database_recreate(cursor, test_name, template=template)
    request.config.stash[TEST_DATABASE] = (test_name, template, True)
    return True


def keep_as_template(test_name: str, template: str) -> None:
    """Copy the freshly migrated test database as the template of later runs, and drop the
    templates of other states of the migrations. Two workers may race: one copy is enough."""
    from django.db import DatabaseError, connections

    prefix = template.rpartition("_")[0]
    connections.close_all()  # a database being copied must have no session
    with connection._nodb_cursor() as cursor:
        try:
            cursor.execute(f'CREATE DATABASE "{template}" TEMPLATE "{test_name}"')
        except DatabaseError:
            return
        cursor.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s) AND datname <> %s",
            [prefix, template],
        )
        for (stale,) in cursor.fetchall():
            with contextlib.suppress(DatabaseError):  # being copied: the next run drops it
                cursor.execute(f'DROP DATABASE IF EXISTS "{stale}"')


# One row: a digest of each of those tables, to tell cheaply whether a test changed one.
MIGRATED_DIGESTS = "SELECT " + ", ".join(  # noqa: S608 (our constants)
    f"(SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY id), '')) FROM {table} t)"  # noqa: S608
    for table in MIGRATED_TABLES
)


class MigratedRows:
    """The rows migrations left (``MIGRATED_TABLES``) as the test database was set up, and
    the way back to them."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = {}
        with connection.cursor() as cursor:
            for table in MIGRATED_TABLES:
                cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 (our constant)
                self.rows[table] = ([c.name for c in cursor.description], cursor.fetchall())
            cursor.execute(MIGRATED_DIGESTS)
            self.digests = cursor.fetchone()

    def empty_the_rest(self) -> None:
        """Empty every other table (``tables_empty``), and put those rows back if a test
        changed them (added a group, say), under their ids. Django's flush would empty them
        all, make content types and permissions again under new ids, and not the staff
        roles."""
        from django.contrib.contenttypes.models import ContentType

        tables_empty()
        with connection.cursor() as cursor:
            cursor.execute(MIGRATED_DIGESTS)
            if cursor.fetchone() == self.digests:
                return
            for table in MIGRATED_TABLES:
                cursor.execute(f"DELETE FROM {table}")  # noqa: S608
            for table in reversed(MIGRATED_TABLES):
                columns, rows = self.rows[table]
                if rows:
                    cursor.executemany(
                        f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608
                        f"VALUES ({', '.join(['%s'] * len(columns))})",
                        rows,
                    )
        ContentType.objects.clear_cache()


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    django_db_keepdb: bool,
    django_db_blocker: Any,
) -> Iterator[None]:
    """pytest-django's test database, set up only for a run with a test that needs one; a
    transactional test then ends with ``MigratedRows.empty_the_rest`` instead of a flush.

    ``make test`` lets an idle worker take tests queued for another (``--dist worksteal``),
    so a test may follow a transactional one on the same process and expect what migrations
    left: the staff roles, and the ids cached in ``ContentType.objects``. Django's flush
    loses both, and runs every app's post_migrate to make half of it again: most of what a
    transactional test cost.
    """
    from django.db import connections
    from django.test import TransactionTestCase

    with django_db_blocker.unblock():
        migrated = MigratedRows()

    def fixture_teardown(self: TransactionTestCase) -> None:
        migrated.empty_the_rest()

    patch = pytest.MonkeyPatch()
    patch.setattr(TransactionTestCase, "_fixture_teardown", fixture_teardown)
    patch.setattr(TestCase, "_fixture_teardown", constraints_checked_and_rolled_back)
    test_name, template, copied = request.config.stash[TEST_DATABASE]
    # Migrated here, into the test database (none is set up for a run that needs none).
    if not django_db_keepdb and connection.settings_dict["NAME"] == test_name:
        with django_db_blocker.unblock():
            keep_as_template(test_name, template)
    yield
    patch.undo()
    if copied:  # kept only for Django: a copy goes as a created database does
        with django_db_blocker.unblock():
            connections.close_all()
            with connection._nodb_cursor() as cursor:
                left = sessions_left(cursor, test_name)
                database_drop(cursor, test_name)
        # FORCE would end them unseen: a connection a test (or a process it started) left
        # open is a leak, found here rather than by the next run that cannot drop it.
        assert not left, f"{left} session(s) still on {test_name} once the tests ended"


def constraints_checked_and_rolled_back(self: TestCase) -> None:
    """Django's end of a test in a transaction, in fewer round trips: its deferred
    constraints checked (``SET CONSTRAINTS ALL IMMEDIATE``, then back to deferred) in one
    statement, and the transaction rolled back. Django asks the server whether the connection
    is usable first (``SELECT 1``), a round trip per test: the connection's own state says
    as much here.
    """
    from django.db import DatabaseError
    from psycopg.pq import TransactionStatus

    case: Any = self  # the private helpers below are not in Django's stubs
    if not case._databases_support_transactions():
        return super(TestCase, case)._fixture_teardown()  # as Django's own does
    try:
        for name in reversed(case._databases_names()):
            db = connections[name]
            if (
                not db.features.can_defer_constraint_checks
                or db.needs_rollback
                or db.connection is None
                or db.connection.info.transaction_status != TransactionStatus.INTRANS
            ):
                continue  # Django's is_usable() would say no, or nothing was deferred
            try:
                with db.cursor() as cursor:
                    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE; SET CONSTRAINTS ALL DEFERRED")
            except DatabaseError:
                if not db.connection.closed:  # the server refused: a violated constraint
                    raise
    finally:
        case._rollback_atomics(case.atomics)


def sessions_left(cursor: Any, database: str, *, grace: float = 5.0) -> int:
    """The sessions on ``database`` still there after ``grace`` seconds (a process that
    just ended takes a moment to leave)."""
    deadline = time.monotonic() + grace
    while True:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database])
        (count,) = cursor.fetchone()
        if not count or time.monotonic() > deadline:
            return int(count)
        time.sleep(0.1)


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


# As the settings module made it, for the tests marked ``staff_mfa``.
_STAFF_MFA_CONFIGURED = pytest.StashKey[bool]()


@pytest.fixture(scope="session", autouse=True)
def suite_settings(request: pytest.FixtureRequest) -> Iterator[None]:
    """What every test runs with, set once for the run: a setting changed per test costs a
    ``setting_changed`` signal and a settings layer made and unmade, in every test.

    Staff MFA is off in tests that are not about it: ``make test`` sets DATABASE_URL, which
    makes MFA required for every staff account (a real deployment), and an admin or browser
    test about something else would meet the second step first (``staff_mfa_as_configured``
    puts it back for the tests about it).

    Passwords are hashed with MD5: staff accounts are made and logged into in hundreds of
    tests, and PBKDF2's deliberate slowness (a million rounds) would be most of their run
    time. No test is about the hash.
    """
    request.config.stash[_STAFF_MFA_CONFIGURED] = settings.DROPPORTAL_STAFF_MFA_REQUIRED
    with override_settings(
        DROPPORTAL_STAFF_MFA_REQUIRED=False,
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    ):
        yield


def _rendering(render: Callable[..., Any]) -> Iterator[None]:
    # Its own patch, not a test's ``monkeypatch``: a test's ``monkeypatch.undo()`` leaves it.
    before = getattr(Template, "_render")  # noqa: B009 (not in Django's stubs)
    setattr(Template, "_render", render)  # noqa: B010
    try:
        yield
    finally:
        setattr(Template, "_render", before)  # noqa: B010


@pytest.fixture(scope="session", autouse=True)
def templates_unrecorded(django_test_environment: None) -> Iterator[None]:
    """Pages render as a deployment renders them, without Django's test record.

    Django's test set-up has every template render send ``template_rendered``, and the test
    client keep each template with a copy of its context (``response.context`` and
    ``response.templates``): a page renders many templates (widgets, rows, includes), and
    copying each one's context is much of what it costs. Most tests read the page, not the
    record. A test that reads the record asks for ``templates_recorded``: without it
    ``response.context`` is None (a read fails), but ``response.templates`` is empty, so a
    check that a template was NOT used (``assertTemplateNotUsed``) would pass unseen."""
    saved = getattr(_TestState, "saved_data", None)
    # Django's own render, as it was before its test environment's set-up.
    yield from _rendering(
        saved.template_render if saved is not None else getattr(Template, "_render")  # noqa: B009
    )


@pytest.fixture
def templates_recorded() -> Iterator[None]:
    """Django's record of what a response rendered: ``response.context``."""
    yield from _rendering(test_utils.instrumented_test_render)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def staff_mfa_as_configured(request: pytest.FixtureRequest) -> None:
    """Tests marked ``@pytest.mark.staff_mfa`` (tests/admin/test_staff_mfa.py) keep the
    setting as the settings module made it, and prove it is on and enforced."""
    if request.node.get_closest_marker("staff_mfa") is not None:
        request.getfixturevalue("settings").DROPPORTAL_STAFF_MFA_REQUIRED = request.config.stash[
            _STAFF_MFA_CONFIGURED
        ]


@pytest.fixture
def api_client() -> APIClient:
    return APIClient()


def bearer(key: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture(scope="session")
def drop_packages_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("drop-packages")


_drop_packages_dirs = itertools.count()


@pytest.fixture(autouse=True)
def drop_packages_in_tmp(drop_packages_root: Path, monkeypatch: Any) -> None:
    """Packages downloaded by a test's `drop pull` go to a temporary folder of its own, not
    var/. The folder is named, not made: a pull makes it (as it makes var/'s), and the few
    tests that pull do not cost every test a directory (``mktemp`` also lists every one made
    before it)."""
    monkeypatch.setattr(
        drop_service, "PACKAGES_DIR", drop_packages_root / str(next(_drop_packages_dirs))
    )


@pytest.fixture
def drop(settings: Any) -> Iterator[DropSimulator]:
    """DROP on loopback, its download open for status files (its key: ``drop.api_key``).
    Tests that need another DROP (notifications, refusals) define their own ``drop``."""
    # The simulator is on loopback: the one explicit opening of the outbound filter.
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    with DropSimulator(
        api_key="dk_test_7Qz9reportKEY42", broker_id="4821", active_download=True
    ) as simulator:
        yield simulator


@pytest.fixture
def tsa(settings: Any) -> Iterator[TsaSimulator]:
    """A time-stamping authority on loopback, as the service's ``DROPPORTAL_TSA_URL``."""
    with TsaSimulator() as running:
        settings.DROPPORTAL_TSA_URL = running.url
        settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True  # the authority is on loopback
        yield running


@pytest.fixture(autouse=True)
def worker_sessions_ended(django_db_blocker: Any) -> Iterator[None]:
    """A worker a test ran (``run_worker``) leaves no session behind it."""
    yield
    with django_db_blocker.unblock():
        worker_sessions_end()


@pytest.fixture(autouse=True)
def fresh_callback_throttles() -> None:
    """Each test starts with nothing counted by the throttles (callbacks, sign-ins through
    the identity provider): they are per process."""
    caches[settings.CALLBACK_THROTTLE_CACHE].clear()
    caches[settings.SIGN_IN_THROTTLE_CACHE].clear()


def sessions_waiting_for_locks(event: str | None = None) -> int:
    """How many sessions of the test database wait for a lock (of the kind ``event``,
    ``advisory`` say): a race test lets its other side go once it is seen waiting."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            "   AND wait_event = coalesce(%s, wait_event)",
            [event],
        )
        return int(cursor.fetchone()[0])


def in_thread(work: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """Start ``work`` in a thread of its own (its own database connection, closed at the
    end): one side of a race test. What it raises lands in ``errors``, for the test to
    report."""

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test, in its own thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition``, failing with ``what`` after 30 s."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def database_url() -> str:
    """The test database as a libpq URL (also a DATABASE_URL), over TCP or a socket."""
    # Django's own connection parameters: HOST and PORT, or the server given in OPTIONS (a
    # URL with a socket directory in its query, as the embedded server's is). Query
    # parameters go to libpq as they are, so a socket directory works as a host name does.
    given = connection.get_connection_params()
    params = {key: given.get(key) for key in ("host", "port", "user", "password")}
    query = urlencode({k: v for k, v in params.items() if v})
    return f"postgres:///{given['dbname']}?{query}"


@contextlib.contextmanager
def database_of_its_own(suffix: str, *, template: str | None = None) -> Iterator[str]:
    """``<test database>_<suffix>`` on the test server, empty or a copy of ``template``: its
    URL (a DATABASE_URL); dropped afterwards."""
    test_name = connection.settings_dict["NAME"]
    name = f"{test_name}_{suffix}"
    with connection._nodb_cursor() as cursor:
        database_recreate(cursor, name, template=template)
    try:
        yield database_url().replace(f"/{test_name}?", f"/{name}?", 1)
    finally:
        with connection._nodb_cursor() as cursor:
            database_drop(cursor, name)


def database_server() -> tuple[str, int] | str:
    """Where the test database's server listens: (host, port), or a Unix socket's path."""
    given = connection.get_connection_params()
    host, port = given.get("host") or "127.0.0.1", int(given.get("port") or 5432)
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


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


# ---------------------------------------------------------------- S3, on loopback


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """moto's S3 server on a free loopback port, for a module's tests: its address."""
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def s3_reached_at(url: str, *, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 at ``url``, reached the way a deployment reaches it: boto3's credential chain (test
    credentials, no profile) and DROPPORTAL_S3_ENDPOINT_URL."""
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.DROPPORTAL_S3_ENDPOINT_URL = url


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
def demo(
    request: pytest.FixtureRequest, django_db_setup: None, django_db_blocker: Any
) -> Iterator[ServedDemo]:
    """``make demo`` run once in this test process and left serving (tests/served_demo.py):
    its story, its URL and its logins' password. Its database is a copy of the migrated
    template when there is one (not with ``--reuse-db``), as the test database is."""
    from tests.served_demo import served_demo

    with django_db_blocker.unblock():
        template = migrated_template(request.config)
    with served_demo(template) as running:
        yield running
    # `make demo` leaves its database to be shown again; a test run's goes with the run.
    with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
        database_drop(cursor, demo_database_name(connection.settings_dict["NAME"]))
