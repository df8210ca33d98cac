"""Building blocks for DROP cycle tests: consumers, deletion targets and DROP packages.

Consumers are written straight to the tables (the registration service has its own tests);
packages come from the loopback DROP stand-in's ``build_drop_zip``::

    items = list(work_items(4))
    consumer(broker, "C-1", email=items[0][1])
    package = drop_zip(broker, {"Email": items[:2], "Phone": items[2:]})
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable, Mapping
from pathlib import Path

from django.utils import timezone

from devtools.drop_simulator import build_drop_zip
from integrations.models import (
    DROP_CAPABILITIES,
    Broker,
    Consumer,
    ConsumerHash,
    Integration,
    IntegrationKind,
    IsiConnection,
)

PACKAGE_DATE = "20261120"


def consumer(broker: Broker, remote_identifier: str, **hashes: str | list[str]) -> Consumer:
    """A registered consumer with Base64 hashes by list type (``email=...``, ``ndz=[...]``)."""
    registered = Consumer.objects.create(
        broker=broker, remote_identifier=remote_identifier, remote_identifier_kind="external_id"
    )
    for hash_type, values in hashes.items():
        for value in [values] if isinstance(values, str) else values:
            ConsumerHash.objects.create(
                consumer=registered,
                broker=broker,
                hash_type=hash_type,
                hash=base64.b64decode(value),
            )
    return registered


def webhook(broker: Broker, name: str = "Main webhook", *, enabled: bool = True) -> Integration:
    return Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.WEBHOOK,
        name=name,
        enabled=enabled,
        url="https://broker.example/drop",
        webhook_secret="whsec_" + "a" * 43,
    )


def isi_connection(
    broker: Broker,
    *,
    capabilities: Iterable[str] = DROP_CAPABILITIES,
    listed: bool = True,
    enabled: bool = True,
) -> IsiConnection:
    integration = Integration.objects.create(
        broker=broker,
        kind=IntegrationKind.ISI,
        name="Broker API",
        enabled=enabled,
        base_url="https://api.broker.example",
        auth="token",
        token="t0ken",
        webhook_secret="whsec_" + "b" * 43,
    )
    return IsiConnection.objects.create(
        integration=integration,
        uuid="7d2c0f43-1f1e-4f27-9d5e-2b8f3a3f0c11",
        capabilities=list(capabilities),
        listed=listed,
        refreshed_at=timezone.now(),
    )


def drop_zip(
    broker: Broker,
    lists: Mapping[str, Iterable[tuple[str, str]]],
    removed: Iterable[tuple[str, str, str]] | None = None,
    *,
    date: str = PACKAGE_DATE,
) -> bytes:
    return build_drop_zip(broker.broker_id, date, lists, removed)


def write_zip(directory: Path, content: bytes, name: str = f"{PACKAGE_DATE}_4821_DROP.zip") -> Path:
    path = directory / name
    path.write_bytes(content)
    return path


def days_after(date: str, days: int) -> dt.date:
    return dt.datetime.strptime(date, "%Y%m%d").date() + dt.timedelta(days=days)
