"""An ISI integration's connections, as the broker lists them on its own REST API::

    isi_connections_refresh(integration=integration, actor="staff:ann")    # on demand
    isi_connections_refresh_for_broker(broker=broker, actor="system")      # before matching

Only connections with both DROP capabilities take part (``IsiConnection.takes_part_in_drop``);
matching gives each of them one deletion request per matched consumer.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from integrations.dispatch import isi, masking
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, Integration, IntegrationKind, IsiConnection
from integrations.outbound_http import RESPONSE_BODY_LIMIT, DeliveryResult
from integrations.selectors.targets import broker_targets
from integrations.services.cycle.isi_tokens import isi_bearer_token
from integrations.services.cycle.requests import pending_requests_target
from integrations.services.cycle.targets import target_gone
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionsRefreshed:
    """What the broker listed, as stored."""

    integration: Integration
    connections: list[IsiConnection]  # every connection known, those listed first
    method: str  # "POST", or "GET" when POST was answered 405
    status: int
    answer: str  # the broker's answer as kept (``_answer_kept``): shown to staff
    pending_requests_queued: int = 0

    @property
    def taking_part(self) -> list[IsiConnection]:
        return [c for c in self.connections if c.takes_part_in_drop]


def isi_connections_refresh(
    *, integration: Integration, actor: str, now: dt.datetime | None = None
) -> ConnectionsRefreshed:
    """List the broker's connections (POST, or GET when POST is answered 405) and store them.

    Listed ones are created or updated; ones no longer listed are kept, marked unlisted (their
    requests refer to them). Requests matched while the broker had no deletion target get this
    integration's connections that take part. Raises ``IsiError`` after a ledger event when
    the broker's answer is not a connection list: the stored list is then left as it was (a
    410 also disables the integration and alerts staff, as a delivery's does), and at once,
    calling nothing, for a retired integration.
    """
    if integration.retired_refusal:
        raise isi.IsiError(integration.retired_refusal)
    url = isi.endpoint(integration.base_url, isi.CONNECTIONS_PATH)
    method, result = _connections_request(url, isi_bearer_token(integration))
    try:
        if result.status is None or result.error or not 200 <= result.status < 300:
            got = f"HTTP {result.status}" if result.status is not None else "no answer"
            raise isi.IsiError(got + (f" ({result.error})" if result.error else ""))
        listed = isi.connections_answer(result)
    except isi.IsiError as exc:
        message = f"{method} {url}: {exc}"
        with transaction.atomic():
            ledger_event_append(
                kind=LedgerKind.ISI_CONNECTIONS_REFRESH_FAILED,
                broker_id=integration.broker.broker_id,
                subject=str(integration.uuid),
                actor=actor,
                data={"url": url, "method": method, "status": result.status, "error": str(exc)},
            )
            if result.status == 410:  # the delivery policy's 410, on any call to the broker
                target_gone(
                    target=integration,
                    broker_id=integration.broker.broker_id,
                    why=f"410 Gone from {url}",
                    when=timezone.now(),
                    by="its connection list",
                )
        raise isi.IsiError(
            message, status=result.status, answer=_answer_kept(result, integration)
        ) from None
    assert result.status is not None

    now = now or timezone.now()
    with transaction.atomic():
        # pending_requests_target below takes it: first, before any row (``matching_lock``).
        matching_lock(broker=integration.broker)
        # Serializes refreshes of one integration, so the listed/unlisted marks agree.
        locked = (
            Integration.objects.select_for_update(of=("self",))
            .select_related("broker")
            .get(pk=integration.pk)
        )
        gone = _connections_store(locked, listed, now=now)
        locked.connections_refreshed_at = now
        locked.save(update_fields=["connections_refreshed_at"])
        integration.connections_refreshed_at = now
        connections = list(
            IsiConnection.objects.filter(integration=locked).order_by("-listed", "uuid")
        )
        queued = (
            pending_requests_target(broker=locked.broker, actor=actor).deletion_requests_queued
            if locked.retired_at is None  # a disabled one is still a target: its requests wait
            else 0
        )
        ledger_event_append(
            kind=LedgerKind.ISI_CONNECTIONS_REFRESHED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.uuid),
            actor=actor,
            data={
                "method": method,
                "listed": len(listed),
                "taking_part": [str(c.uuid) for c in connections if c.takes_part_in_drop],
                "not_taking_part": {
                    str(c.uuid): c.drop_exclusion
                    for c in connections
                    if c.listed and not c.takes_part_in_drop
                },
                "no_longer_listed": [str(u) for u in gone],
                "pending_requests_queued": queued,
            },
        )
    return ConnectionsRefreshed(
        integration=locked,
        connections=connections,
        method=method,
        status=result.status,
        answer=_answer_kept(result, locked),
        pending_requests_queued=queued,
    )


def _answer_kept(result: DeliveryResult, integration: Integration) -> str:
    """The answer as staff are shown it (in a message, a signed cookie): its credentials
    already redacted by ``isi.send``, and what looks like an identifier masked, as a delete's
    answer is kept (an error may name a consumer). The integration's connections, as stored,
    are the UUIDs kept in it: any other may be a consumer's advertising ID."""
    known = IsiConnection.objects.filter(integration=integration).values_list("uuid", flat=True)
    return masking.free_text_masked(
        result.response_body, limit=RESPONSE_BODY_LIMIT, own_uuids=[*known, integration.uuid]
    )


def _connections_request(url: str, token: isi.BearerToken) -> tuple[str, DeliveryResult]:
    """Ask for the connection list: the method used, and the answer."""
    allow_private = settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS
    method = "POST"
    result = isi.send(method, url, body=b"{}", token=token, allow_private=allow_private)
    if result.status == 405:  # docs/contracts.md §3.2: POST, else GET
        method = "GET"
        result = isi.send(method, url, body=b"", token=token, allow_private=allow_private)
    return method, result


def _connections_store(
    locked: Integration, listed: list[isi.ListedConnection], *, now: dt.datetime
) -> list[uuid.UUID]:
    """Create or update the ``listed`` connections, mark the others no longer listed; the
    uuids of those that were listed until now."""
    IsiConnection.objects.bulk_create(
        [
            IsiConnection(
                integration=locked,
                uuid=entry.uuid,
                capabilities=entry.capabilities,
                listed=True,
                refreshed_at=now,
            )
            for entry in listed
        ],
        update_conflicts=True,
        unique_fields=["integration", "uuid"],
        update_fields=["capabilities", "listed", "refreshed_at"],
    )
    gone = list(
        IsiConnection.objects.filter(integration=locked, listed=True)
        .exclude(uuid__in=[entry.uuid for entry in listed])
        .values_list("uuid", flat=True)
    )
    IsiConnection.objects.filter(integration=locked, uuid__in=gone).update(
        listed=False, refreshed_at=now
    )
    return gone


def isi_connections_refresh_for_broker(
    *, broker: Broker, actor: str
) -> list[ConnectionsRefreshed | isi.IsiError]:
    """Refresh every enabled ISI integration of ``broker``: what a cycle does before matching.

    Never raises: a broker whose API does not answer keeps its last known connections (the
    failure is in the ledger and the log), so its DROP cycle is not held up by it.
    """
    outcomes: list[ConnectionsRefreshed | isi.IsiError] = []
    for integration in broker_targets(broker, kind=IntegrationKind.ISI, enabled=True):
        try:
            outcomes.append(isi_connections_refresh(integration=integration, actor=actor))
        except isi.IsiError as exc:
            log.warning(
                "ISI integration %s of broker %s: connections not refreshed, the last known "
                "ones are used: %s",
                integration.uuid,
                broker.broker_id,
                exc,
            )
            outcomes.append(exc)
    return outcomes
