"""Finding work items by what staff know: an id, a UUID, a pointer, a hash, an email or phone.

One term, tried as each thing it can be::

    work_items_find(queryset=WorkItem.objects.all(), term="  CONSUMER.0113@example.COM ")

- a work item id (exact), a deletion or resolution request's UUID;
- a consumer's ``remote_identifier`` (exact, one probe per broker on the unique index);
- a DROP hash (44 characters of Base64);
- a clear email address or phone number, written any way: standardized and hashed here with
  the registration's rules (``drop.standardize``), in memory only. The clear value is never
  stored, logged or sent on: ``search_terms.search_token`` turns it into its hash before the
  admin puts the search in a URL, and refuses what is neither an id nor a hash (a name, words).

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

# A phone number as people write one: digits with spaces, dots, dashes (any Unicode dash),
# slashes, brackets, a plus; maybe a ``tel:`` in front and an extension behind.
_PHONE = re.compile(r"\+?[\d\s().\-/\u2010-\u2015\u2212]{7,}")
_TEL = re.compile(r"^(?:tel:)\s*", re.IGNORECASE)
_MAILTO = re.compile(r"^(?:mailto:)\s*", re.IGNORECASE)
# The extension is not part of the number DROP hashes: ``ext 12``, ``x12``, ``#12``, ``;ext=12``.
_EXTENSION = re.compile(r"\s*(?:;\s*ext=|ext\.?|extension|x|#)\s*\d{1,8}\s*$", re.IGNORECASE)


def clear_identifier_hash(term: str) -> str | None:
    """The DROP hash of ``term`` when it is a clear email address or phone number, else None.

    It is what every admin search box puts in its URL in place of such a term.
    """
    term = term.strip()
    try:
        if "@" in term:
            return email_hash(_MAILTO.sub("", term))
        number = _EXTENSION.sub("", _TEL.sub("", term))
        if _PHONE.fullmatch(number) and sum(ch.isdigit() for ch in number) >= 7:
            return phone_hash(number)
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
    hashed = _hash_bytes(clear_identifier_hash(term) or term)
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
