"""Registering a broker's service providers and contractors (a SaaS connection is not one:
it deletes by itself)::

    provider = service_provider_add(broker=broker, name="Mailhouse", contact="ops@mail.example",
                                    s3_prefix="s3://mailhouse-drop/directives/", actor="cli:alice")
    service_provider_update(provider, changes={"contact": "..."}, actor="staff:bob")
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, ServiceProvider
from integrations.services.ledger import ledger_event_append
from integrations.services.row_updates import Audited, row_update
from integrations.validators import name_characters_validate

NAME_MAX = 200
# What their columns hold: refused here in one line rather than by the database.
CONTACT_MAX = ServiceProvider._meta.get_field("contact").max_length or 254
S3_PREFIX_MAX = ServiceProvider._meta.get_field("s3_prefix").max_length or 500
# An S3 bucket name, the older rules too (capitals, "_"): no "user:password@", no space.
_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")


def s3_prefix_validate(s3_prefix: str) -> str:
    """Blank (directives downloaded from the admin), or ``s3://bucket/`` or
    ``s3://bucket/prefix/``: each directive is written under it by its own name."""
    if not s3_prefix:
        return ""
    bucket, _, _ = s3_prefix.removeprefix("s3://").partition("/")
    if s3_prefix.startswith("s3://") and bucket and not _BUCKET.fullmatch(bucket):
        # Kept, listed and shown to every role that sees providers: an access key written
        # into it (s3://KEY:SECRET@bucket/) would be too. Not echoed: it may be one.
        raise ValidationError(
            "not a bucket name before the first slash (letters, digits, '.', '-', '_'): "
            "credentials come from boto3's usual chain, never the URL"
        )
    if not s3_prefix.startswith("s3://") or not bucket or not s3_prefix.endswith("/"):
        # Not echoed either: a URL of another scheme may carry a key too.
        raise ValidationError("use s3://bucket/prefix/ (ending in a slash)")
    if len(s3_prefix) > S3_PREFIX_MAX:
        raise ValidationError(f"an S3 prefix of at most {S3_PREFIX_MAX} characters")
    return s3_prefix


def _validated(name: str, contact: str, s3_prefix: str) -> dict[str, Any]:
    name = name.strip()
    if not name or len(name) > NAME_MAX:
        raise ValidationError({"name": f"a name of 1 to {NAME_MAX} characters"})
    name_characters_validate(name)
    if len(contact) > CONTACT_MAX:
        raise ValidationError({"contact": f"an email address of at most {CONTACT_MAX} characters"})
    if contact:
        try:
            validate_email(contact)
        except ValidationError:
            raise ValidationError({"contact": f"{contact!r} is not an email address"}) from None
    try:
        s3_prefix = s3_prefix_validate(s3_prefix)
    except ValidationError as exc:
        raise ValidationError({"s3_prefix": exc.messages}) from None
    return {"name": name, "contact": contact, "s3_prefix": s3_prefix}


def service_provider_add(
    *, broker: Broker, name: str, contact: str = "", s3_prefix: str = "", actor: str
) -> ServiceProvider:
    fields = _validated(name, contact, s3_prefix)
    try:
        with transaction.atomic():
            provider = ServiceProvider.objects.create(broker=broker, **fields)
            ledger_event_append(
                kind=LedgerKind.SERVICE_PROVIDER_ADDED,
                broker_id=broker.broker_id,
                subject=str(provider.pk),
                actor=actor,
                data=fields,
            )
    except IntegrityError:
        raise ValidationError(
            {"name": f"broker {broker.broker_id} already has a provider named {fields['name']!r}"}
        ) from None
    return provider


def service_provider_update(
    provider: ServiceProvider, *, changes: dict[str, Any], actor: str
) -> ServiceProvider:
    """Change its name, contact or S3 prefix (directives issued before keep where they went)."""
    merged = {
        "name": provider.name,
        "contact": provider.contact,
        "s3_prefix": provider.s3_prefix,
        **changes,
    }
    fields = _validated(merged["name"], merged["contact"], merged["s3_prefix"])
    try:
        return row_update(
            provider,
            changes={name: fields[name] for name in changes},
            audit=Audited(
                LedgerKind.SERVICE_PROVIDER_UPDATED,
                broker_id=provider.broker.broker_id,
                subject=str(provider.pk),
                actor=actor,
            ),
        )
    except IntegrityError:
        raise ValidationError(
            {"name": f"this broker already has a provider named {fields['name']!r}"}
        ) from None
