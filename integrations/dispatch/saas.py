"""The generic SaaS deletion call (docs/contracts.md §7).

``POST <url>`` with ``Authorization: Bearer <token>`` and the resolved identifiers of the
connection's categories; any 2xx is done. Pure: the caller passes what it loaded::

    payload = saas_deletion_payload(request_uuid=..., broker_id="4821",
                                    identifiers={"email": [{"email": "A@x.com"}]},
                                    categories=["email"])   # None: nothing of those categories
    headers = saas_headers(connection.token)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from integrations.dispatch.transport import Message, Verdict, each, http_post
from integrations.outbound_http import USER_AGENT

DEFAULT_CATEGORIES = ("email",)


def categories_or_default(categories: Iterable[str]) -> list[str]:
    """A connection's identifier categories; ``["email"]`` when none were set (§7)."""
    return list(categories) or list(DEFAULT_CATEGORIES)


def saas_deletion_payload(
    *,
    request_uuid: uuid.UUID | str,
    broker_id: str,
    identifiers: Mapping[str, Any],
    categories: Iterable[str],
) -> dict[str, Any] | None:
    """``{"request_uuid", "broker_id", "identifiers": {<category>: [{<category>: value}]}}``.

    Only the connection's categories are handed over, values exactly as the broker resolved
    them. None when the broker resolved nothing in those categories: there is nothing to ask
    the SaaS to delete.
    """
    selected: dict[str, list[dict[str, str]]] = {}
    for category in categories_or_default(categories):
        entries = identifiers.get(category)
        if not isinstance(entries, list):
            continue
        values = [
            {category: entry[category]}
            for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get(category), str)
        ]
        if values:
            selected[category] = values
    if not selected:
        return None
    return {"request_uuid": str(request_uuid), "broker_id": broker_id, "identifiers": selected}


def saas_headers(token: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class SaasTransport:
    """A POST with the connection's token in ``Message.headers``; a 2xx is the deletion done.
    The call carries clear identifiers, so ``keep_answer=False`` keeps only the answer's
    masked shape (an answer may echo them)."""

    kind = "saas"
    resolves = False  # it deletes with the identifiers others resolved

    def send(self, batch: Sequence[Message], pool: Executor | None) -> list[Verdict]:
        return each(pool, self._post, batch)

    def _post(self, message: Message) -> Verdict:
        return http_post(message, message.headers)
