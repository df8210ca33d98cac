"""Rows for ISI tests: an integration made through its service against a loopback ISI API
(so each test holds its Webhook Secret as a broker does), and the requests matching would
create for its connections, written straight to the tables::

    created = isi_integration_for(broker, api)            # OAuth, connections listed
    request = isi_deletion_request(connection_of(created, CONNECTION_A), remote_identifier="C-1")
"""

from __future__ import annotations

import secrets
from typing import Any

from devtools.isi_simulator import IsiSimulator, connection
from integrations.models import (
    Broker,
    DeletionRequest,
    IsiConnection,
    RequestState,
    ResolutionRequest,
)
from integrations.services.isi import CreatedIsiIntegration, isi_integration_create
from tests.webhook_factories import MATCH_DATE, work_item

CONNECTION_A = "7d2c0f43-1f1e-4f27-9d5e-2b8f3a3f0c11"
CONNECTION_B = "0b9a52d4-58c5-4c3e-8a3c-6f4f2d1c9e21"
CONNECTION_STANDARD = "c4e1f0aa-3b7d-4a55-9b8e-0d2f6a7c8b33"  # privacy/access, privacy/delete


def broker_connections() -> list[dict[str, Any]]:
    """Two connections taking part in DROP and one with only the standard capabilities."""
    return [
        connection(CONNECTION_A),
        connection(CONNECTION_B),
        connection(CONNECTION_STANDARD, ["privacy/access", "privacy/delete"]),
    ]


def isi_integration_for(
    broker: Broker, api: IsiSimulator, *, oauth: bool = True, name: str = "Acme API"
) -> CreatedIsiIntegration:
    credentials = (
        {"token_url": api.token_url, "client_id": api.client_id, "client_secret": api.client_secret}
        if oauth
        else {"token": api.token or ""}
    )
    return isi_integration_create(
        broker=broker, name=name, base_url=api.base_url, actor="test", **credentials
    )


def connection_of(created: CreatedIsiIntegration, uuid: str) -> IsiConnection:
    return IsiConnection.objects.get(integration=created.integration, uuid=uuid)


def isi_deletion_request(
    isi_connection: IsiConnection,
    *,
    state: str = RequestState.QUEUED,
    remote_identifier: str = "C-1",
    **fields: Any,
) -> DeletionRequest:
    integration = isi_connection.integration
    broker = integration.broker
    item = fields.pop("work_item", None) or work_item(broker)
    return DeletionRequest.objects.create(
        state=state,
        results_token=secrets.token_hex(32),
        broker=broker,
        work_item=item,
        integration=integration,
        isi_connection=isi_connection,
        identifier_hash="KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=",
        hash_type="email",
        drop_session_id=item.cycle.drop_session_id,
        match_date=MATCH_DATE,
        broker_id_code=broker.broker_id,
        mode=broker.mode,
        remote_identifier=remote_identifier,
        remote_identifier_kind="external_id",
        **fields,
    )


def isi_resolution_request(
    isi_connection: IsiConnection,
    *,
    state: str = RequestState.QUEUED,
    remote_identifier: str = "C-1",
    **fields: Any,
) -> ResolutionRequest:
    integration = isi_connection.integration
    broker = integration.broker
    item = fields.pop("work_item", None) or work_item(broker)
    return ResolutionRequest.objects.create(
        state=state,
        results_token=secrets.token_hex(32),
        broker=broker,
        work_item=item,
        integration=integration,
        isi_connection=isi_connection,
        drop_session_id=item.cycle.drop_session_id,
        match_date=MATCH_DATE,
        remote_identifier=remote_identifier,
        remote_identifier_kind="external_id",
        **fields,
    )
