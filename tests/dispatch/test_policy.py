"""Retry schedule, jitter, Retry-After and the classification of attempt results."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from integrations.dispatch.policy import MAX_ATTEMPTS, SCHEDULE, classify, next_delay

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp()
EXPECTED = [5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400]


class _NoJitter(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return 1.0


def test_schedule_is_the_documented_one() -> None:
    assert MAX_ATTEMPTS == 10
    assert list(SCHEDULE) == EXPECTED
    assert [next_delay(n, rng=_NoJitter()) for n in range(1, 10)] == EXPECTED


def test_no_attempt_after_the_tenth() -> None:
    assert next_delay(9, rng=_NoJitter()) == 86400
    assert next_delay(10) is None
    assert next_delay(10, status=429, retry_after="60") is None
    assert next_delay(11) is None


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        next_delay(0)


def test_jitter_stays_within_twenty_percent_and_varies() -> None:
    rng = random.Random(1234)
    for attempt, base in enumerate(EXPECTED, start=1):
        delays = [next_delay(attempt, rng=rng) for _ in range(200)]
        assert all(d is not None and 0.8 * base <= d <= 1.2 * base for d in delays)
        assert len(set(delays)) > 100


def test_seeded_jitter_is_reproducible() -> None:
    assert next_delay(3, rng=random.Random(7)) == next_delay(3, rng=random.Random(7))


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_seconds_lengthens_the_wait(status: int) -> None:
    assert next_delay(1, status=status, retry_after="120", rng=_NoJitter()) == 120


def test_retry_after_http_date_is_honoured() -> None:
    in_ten_minutes = format_datetime(datetime.fromtimestamp(NOW + 600, UTC), usegmt=True)

    delay = next_delay(1, status=503, retry_after=in_ten_minutes, rng=_NoJitter(), now=NOW)

    assert delay == 600


def test_retry_after_asctime_date_is_read_as_gmt() -> None:
    # RFC 9110's obsolete asctime form has no zone; it is GMT.
    delay = next_delay(
        1, status=429, retry_after="Sun Mar  1 12:05:00 2026", rng=_NoJitter(), now=NOW
    )

    assert delay == 300


def test_retry_after_is_capped_at_one_hour() -> None:
    assert next_delay(2, status=429, retry_after="86400", rng=_NoJitter()) == 3600


def test_retry_after_never_shortens_the_schedule() -> None:
    assert next_delay(2, status=429, retry_after="1", rng=_NoJitter()) == 300
    past = format_datetime(datetime.fromtimestamp(NOW - 600, UTC), usegmt=True)
    assert next_delay(2, status=429, retry_after=past, rng=_NoJitter(), now=NOW) == 300
    # Beyond an hour the schedule already waits longer than any Retry-After may ask.
    assert next_delay(4, status=429, retry_after="3000", rng=_NoJitter()) == 7200


def test_retry_after_clamps_against_the_jittered_delay() -> None:
    delay = next_delay(3, status=429, retry_after="60", rng=random.Random(5))

    assert delay == next_delay(3, rng=random.Random(5))


@pytest.mark.parametrize("status", [200, 500, 410, None])
def test_retry_after_is_ignored_unless_429_or_503(status: int | None) -> None:
    assert next_delay(1, status=status, retry_after="120", rng=_NoJitter()) == 5


@pytest.mark.parametrize(
    "value",
    [
        "soon",
        "-5",
        "1.5",
        "",
        None,
        # Dates whose fields overflow (OverflowError, read on the sending thread: it undid
        # the whole batch, and its job sent the calls again unrecorded).
        "Mon, 01 Jan 99999999999999999999 00:00:00 GMT",
        "Mon, 01 Jan 2026 99999999999:00:00 GMT",
        "Mon, 99999999999 Jan 2026 00:00:00 GMT",
    ],
)
def test_unreadable_retry_after_falls_back_to_the_schedule(value: str | None) -> None:
    assert next_delay(1, status=429, retry_after=value, rng=_NoJitter()) == 5


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_delivered(status: int) -> None:
    assert classify(status, None) == "delivered"


def test_410_is_gone() -> None:
    assert classify(410, None) == "gone"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (301, "redirect not followed (301)"),
        (302, "redirect not followed (302)"),
        (400, None),
        (404, None),
        (429, None),
        (500, None),
        (503, None),
        (None, "timed out after 15 s"),
        (None, "connection refused"),
        (None, "target address not allowed: 10.0.0.1 is private"),
        (200, "timed out after 15 s"),  # headers came, the body did not in time
    ],
)
def test_everything_else_is_retried(status: int | None, error: str | None) -> None:
    assert classify(status, error) == "retry"
