"""A target that answered 410 Gone: disabled once, in the ledger, and staff alerted. Whatever
call got the 410 (a delivery, or an ISI integration's connection list)::

    target_gone(target=integration, broker_id="4821", why="410 Gone from https://…",
                when=timezone.now(), by="deletion_request 3f2c…")
"""

from __future__ import annotations

import datetime as dt
import logging

from integrations import enqueue
from integrations.drop.calendar import drop_time_text
from integrations.ledger_kinds import LedgerKind
from integrations.models import Integration, SaasConnection
from integrations.services.ledger import ledger_event_append
from integrations.url_extras import without_url_extras

logger = logging.getLogger(__name__)


def target_gone(
    *,
    target: Integration | SaasConnection,
    broker_id: str,
    why: str,
    when: dt.datetime,
    by: str,
) -> bool:
    """Disable ``target`` (nothing more is sent to it until staff enable it again), with a
    ledger event naming ``by`` (what got the 410) and an alert once the caller's transaction
    commits; False when it was disabled already."""
    reason = f"{without_url_extras(why)} at {drop_time_text(when)}"
    # Ours, not staff's: cut to the column rather than refused (column_fits is for input).
    width = type(target)._meta.get_field("disabled_reason").max_length
    # Conditional: of several calls hitting the 410 at once, one disables and alerts.
    disabled = (
        type(target)
        .objects.filter(pk=target.pk, enabled=True)
        .update(enabled=False, disabled_reason=reason[:width])
    )
    if not disabled:
        return False
    integration = isinstance(target, Integration)
    name = "integration" if integration else "saas_connection"
    logger.warning("%s %s disabled: %s", name, target.pk, reason)
    ledger_event_append(
        kind=LedgerKind.INTEGRATION_DISABLED
        if integration
        else LedgerKind.SAAS_CONNECTION_DISABLED,
        broker_id=broker_id,
        subject=str(target.uuid) if integration else str(target.pk),
        data={
            "name": target.name,
            "reason": reason,
            "alert": True,  # staff must act: nothing is delivered to it until re-enabled
            "by": by,
        },
    )
    enqueue.alerts_evaluate_enqueue()  # in the caller's transaction: alerted once it commits
    return True
