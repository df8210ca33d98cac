"""The transports, by kind of target: the one place the delivery loop finds them.

A new kind of target is one class with the ``dispatch.transport.Transport`` protocol, in its
own module, and one entry here.
"""

from __future__ import annotations

from integrations.dispatch.isi import IsiTransport
from integrations.dispatch.saas import SaasTransport
from integrations.dispatch.transport import Transport
from integrations.dispatch.webhook import WebhookTransport

TRANSPORTS: dict[str, Transport] = {
    transport.kind: transport for transport in (WebhookTransport(), IsiTransport(), SaasTransport())
}
