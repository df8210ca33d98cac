"""A PostgreSQL restart under concurrent callbacks, through gunicorn as deployed (two
workers, ``dropportal.gunicorn_conf``): every callback gets an answer, 200 or 503 with
``Retry-After`` and a problem body, no worker is killed by gunicorn's timeout, and each
callback answered 503 is recorded when the broker sends it again.

The server is the test's own (``ThrowawayPostgres``), really restarted; the shared one is
never touched. It is reached through ``DatabaseProxy``, which leaves new connections
unanswered while the server is away, as a database host that drops packets while it
restarts does (on loopback a closed port is refused at once, which hides the waits). The
outage lasts longer than gunicorn's timeout, which is shortened from its 30 s to 5 s to
keep the test short; the connect timeout stays below both, shortened from the settings' 5 s
to libpq's least, 2 s (a parameter in ``DATABASE_URL``'s query, as an operator sets it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import migrations_fingerprint, subprocess_env
from tests.db_proxy import DatabaseProxy
from tests.raw_callbacks import Answer, signed_deletion_callback
from tests.served_gunicorn import served_gunicorn
from tests.throwaway_postgres import ThrowawayPostgres, build

CALLBACKS = 240
CLIENTS = 6
OUTAGE_AFTER = 40  # callbacks answered before the restart
OUTAGE_SECONDS = 6
WEB_TIMEOUT = 5
CONNECT_TIMEOUT = 2

# The system checks once, as gunicorn starts, not in migrate too.
_MIGRATED = """
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0, skip_checks=True)
"""

_WORLD = """
import datetime as dt, json, os
from django.utils import timezone
from integrations.dispatch import signing
from integrations.models import (
    DeletionRequest, DropCycle, Integration, IntegrationKind, RequestState, WorkItem,
)
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import api_key_create

broker = broker_create(broker_id="4821", name="Acme", actor="test")
secret = signing.generate_webhook_secret()
integration = Integration.objects.create(
    broker=broker, kind=IntegrationKind.WEBHOOK, name="Acme", webhook_secret=secret,
    url="https://broker.example/hook",
)
key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
today = timezone.localdate()
cycle = DropCycle.objects.create(
    broker=broker, drop_session_id="1", zip_name="p.zip", zip_sha256="0" * 64,
    downloaded_at=timezone.now(), match_date=today, due_date=today + dt.timedelta(days=45),
)
items = WorkItem.objects.bulk_create(
    WorkItem(broker=broker, cycle=cycle, work_item_id=f"R{i:011d}", hash_type="email",
             hash=os.urandom(32), file_name="p_Email.csv")
    for i in range(COUNT)
)
rows = DeletionRequest.objects.bulk_create(
    DeletionRequest(
        state=RequestState.DISPATCHED, dispatched_at=timezone.now(), broker=broker,
        work_item=item, integration=integration,
        identifier_hash="KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=", hash_type="email",
        drop_session_id="1", match_date=today, broker_id_code="4821", mode="test",
    )
    for item in items
)
print(json.dumps({"key": key, "secret": secret, "requests": [str(r.request_uuid) for r in rows]}))
"""


def _manage(*args: str, url: str) -> str:
    done = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        env=subprocess_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _put(port: int, world: dict[str, Any], request_uuid: str) -> Answer | None:
    """One signed ``deleted`` callback on a new connection; None when nothing came back."""
    raw = signed_deletion_callback(
        port, key=world["key"], secret=world["secret"], request_uuid=request_uuid
    )
    received = bytearray()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=90) as sock:
            sock.sendall(raw)
            while chunk := sock.recv(65536):
                received += chunk
    except OSError:
        return None
    return Answer(bytes(received)) if received else None


# Stopped clusters with a migrated "dropportal" database, kept in the temporary folder as
# the test database's template is kept on its server: one per state of the migrations and
# PostgreSQL build, dropped when unused for this long.
MIGRATED_CLUSTER_PREFIX = "dp_throwaway_pg_migrated_"
MIGRATED_CLUSTER_KEPT = 24 * 3600


def _migrated_cluster() -> Path:
    """A stopped cluster whose database "dropportal" is migrated: made by migrating an empty
    one the first time (most of this test's start-up), copied from then on."""
    key = hashlib.sha256(f"{migrations_fingerprint()}:{build()}".encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir())
    cluster = folder / f"{MIGRATED_CLUSTER_PREFIX}{key}"
    if not (cluster / "PG_VERSION").exists():
        with ThrowawayPostgres() as server:
            url = server.create_database("dropportal")
            _manage("shell", "-c", _MIGRATED, url=url)
            server.saved(cluster)
    os.utime(cluster)  # in use: kept
    for other in folder.glob(f"{MIGRATED_CLUSTER_PREFIX}*"):
        with contextlib.suppress(OSError):  # another run's, gone meanwhile
            if other != cluster and time.time() - other.stat().st_mtime > MIGRATED_CLUSTER_KEPT:
                shutil.rmtree(other, ignore_errors=True)
    return cluster


@pytest.fixture
def database() -> Iterator[tuple[ThrowawayPostgres, str, dict[str, Any]]]:
    with ThrowawayPostgres(copy_of=_migrated_cluster()) as server:
        url = server.url("dropportal")
        code = _WORLD.replace("COUNT", str(CALLBACKS))
        world = json.loads(_manage("shell", "-c", code, url=url).splitlines()[-1])
        yield server, url, world


@pytest.fixture
def web(
    database: tuple[ThrowawayPostgres, str, dict[str, Any]], tmp_path: Path
) -> Iterator[tuple[int, DatabaseProxy, Path]]:
    server, url, _ = database
    log = tmp_path / "gunicorn.log"
    with DatabaseProxy(("127.0.0.1", server.port)) as proxy:
        env = subprocess_env(
            DATABASE_URL=url.replace(str(server.port), str(proxy.port))
            + f"?connect_timeout={CONNECT_TIMEOUT}",
            DROPPORTAL_CALLBACK_RATE_LIMIT="0",
        )
        with served_gunicorn(env, log, "--timeout", str(WEB_TIMEOUT)) as port:
            yield port, proxy, log


@pytest.mark.slow
def test_a_database_restart_under_load_answers_every_callback(
    database: tuple[ThrowawayPostgres, str, dict[str, Any]], web: tuple[int, DatabaseProxy, Path]
) -> None:
    server, url, world = database
    port, proxy, log = web
    pending: queue.Queue[str] = queue.Queue()
    for request_uuid in world["requests"]:
        pending.put(request_uuid)
    answers: dict[str, Answer | None] = {}
    lock = threading.Lock()

    def client() -> None:
        while True:
            try:
                request_uuid = pending.get_nowait()
            except queue.Empty:
                return
            answer = _put(port, world, request_uuid)
            with lock:
                answers[request_uuid] = answer

    clients = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in clients:
        thread.start()
    while len(answers) < OUTAGE_AFTER and any(t.is_alive() for t in clients):
        time.sleep(0.05)
    proxy.hold()  # the host stops answering, then the server restarts behind it
    server.restart()
    time.sleep(OUTAGE_SECONDS)
    proxy.release()
    for thread in clients:
        thread.join(timeout=300)

    unanswered = [u for u, answer in answers.items() if answer is None]
    statuses = Counter(a.status for a in answers.values() if a is not None)
    assert len(answers) == CALLBACKS
    assert "WORKER TIMEOUT" not in log.read_text(), statuses
    assert unanswered == [], f"{len(unanswered)} callbacks got no answer; {statuses}"
    assert sorted(statuses) == [200, 503], statuses  # the outage was met, and it ended
    refused = [u for u, a in answers.items() if a is not None and a.status == 503]
    codes: Counter[str] = Counter()
    for request_uuid in refused:
        answer = answers[request_uuid]
        assert answer is not None
        assert answer.headers["content-type"] == "application/problem+json"
        code = json.loads(answer.body)["code"]
        codes[code] += 1
        # A callback that waited for a thread while the others waited on the database is
        # refused as "overloaded" (dropportal/gunicorn_worker.py), with a shorter wait.
        if code == "database_unavailable":
            assert answer.headers["retry-after"] == "30"
        else:
            assert code == "overloaded"
            assert int(answer.headers["retry-after"]) >= 1
    assert codes["database_unavailable"], codes

    # The broker sends again what was answered 503: every outcome is recorded, once.
    again = [_put(port, world, request_uuid) for request_uuid in refused]
    assert [a.status if a else None for a in again] == [200] * len(refused)
    with psycopg.connect(url) as conn:
        (completed,) = conn.execute(
            "SELECT count(*) FROM integrations_deletionrequest WHERE state = 'completed'"
        ).fetchone() or (0,)
    assert completed == CALLBACKS
