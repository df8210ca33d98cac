"""Finding work items by what staff know: an id, a UUID, a pointer, a hash, an email or phone.

One term, tried as each thing it can be::

    work_items_find(queryset=WorkItem.objects.all(), term="  CONSUMER.0113@example.COM ")

- a work item id (exact), a deletion or resolution request's UUID;
- a consumer's ``remote_identifier`` (exact, one probe per broker on the unique index);
- a DROP hash (44 characters of Base64);
- a clear email address or phone number, written any way: standardized and hashed here with
  the registration's rules (``drop.standardize``), in memory only. The clear value is never
  stored, logged or sent on: ``search_token`` turns it into its hash before the admin puts
  the search in a URL.

A hash finds the items DROP sent with it, and every item matched to a consumer registered
with it (their other lists too).
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from typing import Any

from django.db.models import Q, QuerySet

from integrations.drop.standardize import InvalidIdentifier, email_hash, is_valid_hash, phone_hash
from integrations.models import (
    Broker,
    Consumer,
    ConsumerHash,
    DeletionRequest,
    ResolutionRequest,
    WorkItem,
)

# A phone number as people write one: digits with spaces, dots, dashes, brackets, a plus.
_PHONE = re.compile(r"\+?[\d\s().\-]{7,}")


def search_token(term: str) -> str:
    """``term`` as it may be shown and put in a URL: a clear email or phone as its hash."""
    term = term.strip()
    hashed = _identifier_hash(term)
    return hashed if hashed is not None else term


def _identifier_hash(term: str) -> str | None:
    try:
        if "@" in term:
            return email_hash(term)
        if _PHONE.fullmatch(term) and sum(ch.isdigit() for ch in term) >= 7:
            return phone_hash(term)
    except InvalidIdentifier:
        return None
    return None


def _hash_bytes(term: str) -> bytes | None:
    if not is_valid_hash(term):
        return None
    try:
        return base64.b64decode(term, validate=True)
    except binascii.Error:
        return None


def work_items_find(*, queryset: QuerySet[WorkItem], term: str) -> QuerySet[WorkItem]:
    term = term.strip()
    if not term:
        return queryset
    found = Q(work_item_id=term)
    requests: list[QuerySet[Any]] = []
    try:
        request_uuid = uuid.UUID(term)
    except ValueError:
        pass
    else:
        requests += [
            DeletionRequest.objects.filter(request_uuid=request_uuid),
            ResolutionRequest.objects.filter(request_uuid=request_uuid),
        ]
    # The unique index is (broker, remote_identifier): naming the brokers probes it per broker.
    brokers = list(Broker.objects.values_list("pk", flat=True))
    consumers = Consumer.objects.filter(broker_id__in=brokers, remote_identifier=term)
    hashed = _hash_bytes(search_token(term))
    if hashed is not None:
        found |= Q(hash=hashed)
        registered = ConsumerHash.objects.filter(broker_id__in=brokers, hash=hashed)
        consumers = Consumer.objects.filter(
            Q(pk__in=consumers.values("pk")) | Q(pk__in=registered.values("consumer_id"))
        )
    requests += [
        DeletionRequest.objects.filter(consumer__in=consumers.values("pk")),
        ResolutionRequest.objects.filter(consumer__in=consumers.values("pk")),
    ]
    for matched in requests:
        found |= Q(pk__in=matched.values("work_item_id"))
    return queryset.filter(found)
