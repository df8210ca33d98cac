"""Rows for webhook tests: a cycle, work items, and the requests matching would create.

Integrations are made through the service (so each test holds its Webhook Secret the way a
broker does); requests are written straight to the tables, as matching writes them::

    created = webhook_integration_for(broker, simulator.url)
    request = deletion_request(created.integration, remote_identifier="C-1")
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Iterator
from typing import Any

from django.db import connection
from django.utils import timezone

from integrations.models import (
    Broker,
    DeletionRequest,
    DropCycle,
    Integration,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItem,
)
from integrations.services.integrations import CreatedIntegration, webhook_integration_create

MATCH_DATE = dt.date(2026, 11, 20)


def webhook_integration_for(broker: Broker, url: str, name: str = "Acme CRM") -> CreatedIntegration:
    return webhook_integration_create(broker=broker, name=name, url=url, actor="test")


def cycle(broker: Broker, session: str = "1") -> DropCycle:
    found = DropCycle.objects.filter(broker=broker, drop_session_id=session).first()
    if found:
        return found
    return DropCycle.objects.create(
        broker=broker,
        drop_session_id=session,
        zip_name=f"20261120_{broker.broker_id}_DROP.zip",
        zip_sha256=hashlib.sha256(f"{broker.pk}:{session}".encode()).hexdigest(),
        downloaded_at=timezone.now(),
        match_date=MATCH_DATE,
        due_date=MATCH_DATE + dt.timedelta(days=45),
    )


def work_item(broker: Broker, session: str = "1") -> WorkItem:
    return WorkItem.objects.create(
        broker=broker,
        cycle=cycle(broker, session),
        work_item_id=secrets.token_hex(6).upper(),
        hash_type="email",
        hash=secrets.token_bytes(32),
        file_name=f"20261120_{broker.broker_id}_Email.csv",
    )


def deletion_request(
    integration: Integration | None,
    *,
    broker: Broker | None = None,
    state: str = RequestState.QUEUED,
    remote_identifier: str = "C-1",
    **fields: Any,
) -> DeletionRequest:
    broker = broker or (integration.broker if integration else None)
    assert broker is not None
    item = fields.pop("work_item", None) or work_item(broker)
    return DeletionRequest.objects.create(
        state=state,
        broker=broker,
        work_item=item,
        integration=integration,
        identifier_hash="KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=",
        hash_type="email",
        drop_session_id=item.cycle.drop_session_id,
        match_date=MATCH_DATE,
        broker_id_code=broker.broker_id,
        mode=broker.mode,
        remote_identifier=remote_identifier,
        remote_identifier_kind="external_id" if remote_identifier else "",
        **fields,
    )


def resolution_request(
    integration: Integration,
    *,
    state: str = RequestState.QUEUED,
    remote_identifier: str = "C-1",
    **fields: Any,
) -> ResolutionRequest:
    broker = integration.broker
    item = fields.pop("work_item", None) or work_item(broker)
    return ResolutionRequest.objects.create(
        state=state,
        results_token=secrets.token_hex(32),
        broker=broker,
        work_item=item,
        integration=integration,
        drop_session_id=item.cycle.drop_session_id,
        match_date=MATCH_DATE,
        remote_identifier=remote_identifier,
        remote_identifier_kind="external_id",
        **fields,
    )


def saas_connection(broker: Broker, url: str, **fields: Any) -> SaasConnection:
    fields.setdefault("identifier_categories", ["email"])
    return SaasConnection.objects.create(
        broker=broker, name=fields.pop("name", "Mailer"), url=url, **fields
    )


def saas_deletion(
    resolution: ResolutionRequest, connection_: SaasConnection, **fields: Any
) -> SaasDeletion:
    fields.setdefault("state", RequestState.QUEUED)
    return SaasDeletion.objects.create(resolution=resolution, saas_connection=connection_, **fields)


def truncate_jobs() -> Iterator[None]:
    """For transactional tests: Procrastinate's tables are not flushed by Django."""

    def truncate() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE procrastinate_jobs, procrastinate_periodic_defers, "
                "procrastinate_workers CASCADE"
            )

    truncate()
    yield
    truncate()
