"""Delivery policy for every transport's calls (docs/contracts.md §6).

Ten attempts over about three days; the wait after attempt *n* is ``SCHEDULE[n - 1]`` with
±20 % jitter, so that a broker coming back from an outage is not hit by every retry at once::

    result = deliver(...)
    outcome = classify(result.status, result.error)      # "delivered" | "retry" | "gone"
    if outcome == "retry":
        delay = next_delay(attempt_number, status=result.status,
                           retry_after=result.response_headers.get("Retry-After"))
        if delay is None:
            ...  # undeliverable: staff see it and can redeliver
"""

from __future__ import annotations

import random
from typing import Literal

from integrations.outbound_http import retry_after_seconds

MAX_ATTEMPTS = 10

# The automatic redispatch of failed outcomes (off unless DROPPORTAL_AUTO_REDISPATCH_HOURS):
# its actor in the ledger, and how often it sends one request again before staff must.
AUTO_REDISPATCH_ACTOR = "system:auto-redispatch"
AUTO_REDISPATCH_MAX = 3

# Seconds to wait after attempt 1, 2, ... 9 failed; attempt 10 is the last one.
SCHEDULE: tuple[int, ...] = (
    5,
    5 * 60,
    30 * 60,
    2 * 3600,
    5 * 3600,
    10 * 3600,
    14 * 3600,
    20 * 3600,
    24 * 3600,
)
JITTER = 0.2
RETRY_AFTER_CEILING = 3600
RETRY_AFTER_STATUSES = frozenset({429, 503})

Outcome = Literal["delivered", "retry", "gone"]

assert len(SCHEDULE) == MAX_ATTEMPTS - 1

_system_random = random.SystemRandom()


def next_delay(
    attempt_number: int,
    *,
    retry_after: str | None = None,
    status: int | None = None,
    asked: float | None = None,
    rng: random.Random | None = None,
    now: float | None = None,
) -> float | None:
    """Seconds to wait after failed attempt ``attempt_number`` (1-based); None when it was the last.

    On 429/503 a ``Retry-After`` can lengthen the wait up to one hour, never shorten it below
    the (jittered) schedule; so can ``asked``, the seconds a transport's verdict says its
    target asked for (``dispatch.transport.Verdict.retry_after``).
    """
    if attempt_number < 1:
        raise ValueError(f"attempt_number starts at 1, got {attempt_number}")
    if attempt_number >= MAX_ATTEMPTS:
        return None
    rng = rng or _system_random
    scheduled = SCHEDULE[attempt_number - 1] * rng.uniform(1 - JITTER, 1 + JITTER)
    if asked is None and status in RETRY_AFTER_STATUSES:
        asked = retry_after_seconds(retry_after, now=now)
    if asked is not None:
        return max(scheduled, min(asked, float(RETRY_AFTER_CEILING)))
    return scheduled


def classify(status: int | None, error: str | None) -> Outcome:
    """What an attempt's result means for the request.

    Only a 2xx that arrived completely within the timeout is delivered. 410 means the target
    is gone for good (the integration is disabled). Everything else is retried: 3xx (redirects
    are never followed), 4xx, 5xx, timeouts, refused or broken connections.
    """
    if status == 410:
        return "gone"
    if status is not None and 200 <= status < 300 and error is None:
        return "delivered"
    return "retry"
