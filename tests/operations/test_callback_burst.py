"""A burst of callbacks, more than the web processes can take, through gunicorn as deployed
(``dropportal.gunicorn_conf``, two workers as ``manage.py serve``): every caller gets an
answer, 200 or 503 with ``Retry-After``, none is left waiting; and what was refused is
recorded when the broker sends it again.

The burst is larger than the server's capacity on any machine: the test holds the rows the
callbacks write (``FOR UPDATE``), so the callbacks that reach the database wait, and every
thread that takes one is busy until the test lets go. It lets go once half of the callers
have their answer (refused callers answer that), or once the callers' timeout has passed.
With sync workers the two workers each waited on one callback and every other caller waited
unanswered in the kernel's accept queue, until its timeout.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from integrations.models import DeletionRequest, RequestState, WorkItem
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import api_key_create
from tests.builders import (
    CurrentCycleFactory,
    DeletionRequestFactory,
    WebhookIntegrationFactory,
    WorkItemFactory,
)
from tests.conftest import database_url, subprocess_env
from tests.raw_callbacks import Answer, signed_deletion_callback
from tests.served_gunicorn import served_gunicorn

CALLBACKS = 300
# Far above what an answer takes here (the refusals come at once, the rest when the rows
# are let go): a slow machine does not make a caller give up.
CLIENT_TIMEOUT = 60.0


async def _send(port: int, raw: bytes) -> Answer | None:
    """``raw`` on a new connection; its answer, None when none came within the timeout."""
    writer = None
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            received = await reader.read()
    except (TimeoutError, OSError):
        return None
    finally:
        if writer is not None:
            writer.close()
    return Answer(received) if received else None


async def _burst(
    port: int, requests: list[bytes], held: psycopg.Connection[Any]
) -> list[Answer | None]:
    """Every request at once; the rows are let go (``held`` rolled back) when half have
    their answer, or when every caller is done."""
    sent = [asyncio.ensure_future(_send(port, raw)) for raw in requests]
    while not all(s.done() for s in sent):
        if held.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            answered = sum(1 for s in sent if s.done() and s.result() is not None)
            if answered >= len(requests) // 2:
                held.rollback()
        await asyncio.sleep(0.05)
    held.rollback()
    return [s.result() for s in sent]


@pytest.fixture
def world(transactional_db: None) -> tuple[str, str, list[DeletionRequest]]:
    broker = broker_create(broker_id="4821", name="Acme", mode="test", actor="test")
    integration = WebhookIntegrationFactory.create(broker=broker)
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    # Written in two statements, not three per row (the factories' save of each): the rows
    # are the same, the callbacks meet the same world.
    cycle = CurrentCycleFactory.create(broker=broker)
    items = WorkItem.objects.bulk_create(WorkItemFactory.build_batch(CALLBACKS, cycle=cycle))
    rows = DeletionRequest.objects.bulk_create(
        DeletionRequestFactory.build(work_item=item, integration=integration, dispatched=True)
        for item in items
    )
    return key, integration.webhook_secret, rows


@pytest.fixture
def web(world: object, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    log = tmp_path / "gunicorn.log"
    # One key sends the whole burst: its rate limit would refuse part of it (429), which is
    # not what is tested here.
    with served_gunicorn(subprocess_env(DROPPORTAL_CALLBACK_RATE_LIMIT="0"), log) as port:
        yield port, log


@pytest.mark.slow
def test_a_burst_beyond_capacity_gets_every_caller_an_answer(
    world: tuple[str, str, list[DeletionRequest]], web: tuple[int, Path]
) -> None:
    key, secret, rows = world
    port, log = web
    uuids = [str(row.request_uuid) for row in rows]

    def callback(request_uuid: str) -> bytes:
        return signed_deletion_callback(port, key=key, secret=secret, request_uuid=request_uuid)

    held = psycopg.connect(database_url())
    held.execute(
        "SELECT 1 FROM integrations_deletionrequest WHERE id = ANY(%s) FOR UPDATE",
        [[row.pk for row in rows]],
    )
    try:
        answers = asyncio.run(_burst(port, [callback(u) for u in uuids], held))
    finally:
        held.close()

    unanswered = sum(1 for a in answers if a is None)
    statuses = Counter(a.status for a in answers if a is not None)
    assert unanswered == 0, f"{unanswered} callers got no answer; {statuses}; {log.read_text()}"
    assert set(statuses) <= {200, 503}, statuses
    refused = [u for u, a in zip(uuids, answers, strict=True) if a is not None and a.status == 503]
    assert refused, statuses  # the burst was beyond capacity, and some of it was refused
    codes: Counter[str] = Counter()
    for request_uuid in refused:
        answer = answers[uuids.index(request_uuid)]
        assert answer is not None
        assert int(answer.headers["retry-after"]) >= 1
        assert answer.headers["content-type"] == "application/problem+json"
        codes[json.loads(answer.body)["code"]] += 1
    assert set(codes) <= {"overloaded", "database_unavailable"}, codes
    assert "overloaded" in codes, codes

    # The broker sends again what was refused: every outcome is recorded, once.
    again = asyncio.run(_again(port, [callback(u) for u in refused]))
    assert [a.status if a else None for a in again] == [200] * len(refused)
    assert DeletionRequest.objects.filter(state=RequestState.COMPLETED).count() == CALLBACKS


async def _again(port: int, requests: list[bytes]) -> list[Answer | None]:
    return [await _send(port, raw) for raw in requests]
