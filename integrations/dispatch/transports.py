"""The transports, by kind of target: the one place the delivery loop and matching find them.

A new kind of target is one class with the ``dispatch.transport.Transport`` protocol, in its
own module, and one entry here. Its integrations are deletion targets (matching gives each a
request) once it words their requests too (``RequestWording``); ISI, the one kind worded in
``services``, has its own branch where targets are chosen (its connections are the targets).
"""

from __future__ import annotations

from integrations.dispatch.isi import IsiTransport
from integrations.dispatch.saas import SaasTransport
from integrations.dispatch.transport import RequestWording, Transport
from integrations.dispatch.webhook import WebhookTransport

TRANSPORTS: dict[str, Transport] = {
    transport.kind: transport for transport in (WebhookTransport(), IsiTransport(), SaasTransport())
}


def wording(kind: str) -> RequestWording | None:
    """The transport of ``kind`` if it words its integrations' requests itself."""
    transport = TRANSPORTS.get(kind)
    return transport if isinstance(transport, RequestWording) else None


def worded_kinds() -> list[str]:
    """The kinds of integration that are themselves deletion targets."""
    return sorted(kind for kind in TRANSPORTS if wording(kind) is not None)


def resolving_kinds() -> list[str]:
    """The kinds whose targets are asked for identifiers too (``Transport.resolves``)."""
    return sorted(kind for kind, transport in TRANSPORTS.items() if transport.resolves)
