"""The transports, by kind of target: the one place the delivery loop and matching find them.

A new kind of target is one class with the ``dispatch.transport.Transport`` protocol, in its
own module, and one entry here. Its integrations are deletion targets (matching gives each a
request) once it builds their requests' messages too (``RequestMessages``); ISI, the one kind
whose messages are built in ``services``, has its own branch where targets are chosen (its
connections are the targets).
"""

from __future__ import annotations

from integrations.dispatch.isi import IsiTransport
from integrations.dispatch.saas import SaasTransport
from integrations.dispatch.transport import RequestMessages, Transport
from integrations.dispatch.webhook import WebhookTransport

TRANSPORTS: dict[str, Transport] = {
    transport.kind: transport for transport in (WebhookTransport(), IsiTransport(), SaasTransport())
}


def request_messages(kind: str) -> RequestMessages | None:
    """The transport of ``kind`` if it builds its integrations' request messages itself."""
    transport = TRANSPORTS.get(kind)
    return transport if isinstance(transport, RequestMessages) else None


def direct_target_kinds() -> list[str]:
    """The kinds of integration that are themselves deletion targets."""
    return sorted(kind for kind in TRANSPORTS if request_messages(kind) is not None)


def resolving_kinds() -> list[str]:
    """The kinds whose targets are asked for identifiers too (``Transport.resolves``)."""
    return sorted(kind for kind, transport in TRANSPORTS.items() if transport.resolves)
