"""The API answers as its OpenAPI schema says: Schemathesis generates requests from the schema
(valid ones and, where the server validates, invalid ones) and checks every answer.

Through the WSGI application in this test's transaction, with a fixed seed and a few examples
per operation, so that it stays a quick, repeatable part of ``make test``. An API key with
every scope reaches past the 401s; the signed callbacks and DROP's signed notifications (an
HMAC the generator cannot make) are checked for server errors and documented answers only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, assume, given, settings
from schemathesis import APIOperation, GenerationMode, checks
from schemathesis.core.result import Ok

from integrations.api.outcomes import MomentField
from integrations.models import Broker
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import CreatedApiKey
from tests.builders import outcome_history

# Examples per operation and mode (valid, invalid): most of the time goes into generating
# them. A signed callback stops at its signature (401) or before it (404), whatever the
# body, so fewer do there.
EXAMPLES = 10
SIGNED_EXAMPLES = 5

# What every answer is held to: no server error, a documented status, content type and body.
DOCUMENTED = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]
# And where the generator can reach the validation: what the schema allows is accepted, what
# it forbids is refused.
EXACT = [*DOCUMENTED, checks.positive_data_acceptance, checks.negative_data_rejection]


def _conflicting_parameters(case: schemathesis.Case) -> bool:
    """A rule between two parameters, which OpenAPI cannot state (its answer, 400, is
    described): until after since."""
    query: dict[str, Any] = dict(case.query or {})
    if {"since", "until"} <= query.keys():
        since = MomentField(end=False).to_internal_value(query["since"])
        if MomentField(end=True).to_internal_value(query["until"]) <= since:
            return True
    return False


@pytest.fixture
def api_schema(db: None) -> Iterator[schemathesis.schemas.BaseSchema]:
    # Requests run in this test's transaction: Django would close its connection around
    # each (Django's test client disconnects these signals the same way).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    # Every refused request would log a warning; server errors still log (and fail).
    request_log = logging.getLogger("django.request")
    level = request_log.level
    request_log.setLevel(logging.ERROR)
    try:
        schema = schemathesis.openapi.from_wsgi(
            "/api/v1/schema?format=json", get_wsgi_application()
        )
        yield schema
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
        request_log.setLevel(level)


@pytest.fixture
def every_scope_key(broker: Broker, make_key: Callable[..., CreatedApiKey]) -> str:
    other = broker_create(broker_id="1234", name="Other", mode="test", actor="test")
    outcome_history(broker, other)  # rows for the outcomes' answers to be checked against
    return make_key("webhook_callback", "ingest", "audit", "suppression").key


@pytest.mark.slow
def test_the_api_answers_as_its_schema_says(
    api_schema: schemathesis.schemas.BaseSchema,
    every_scope_key: str,
    subtests: pytest.Subtests,
) -> None:
    headers = {"Authorization": f"Bearer {every_scope_key}"}
    results = list(api_schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results)  # the schema is valid
    assert len(operations) >= 8  # the schema lists the whole API

    for operation in operations:
        for mode in GenerationMode:
            with subtests.test(operation=operation.label, mode=mode.value):
                _fuzz(operation, mode, headers)


def _fuzz(operation: APIOperation, mode: GenerationMode, headers: dict[str, str]) -> None:
    # DROP's notifications are signed too, with a secret of DROP's portal.
    signed = operation.path.startswith(("/api/v1/drop/callbacks/", "/api/v1/drop/notifications/"))

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=SIGNED_EXAMPLES if signed else EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: schemathesis.Case) -> None:
        if mode is GenerationMode.POSITIVE:
            assume(not _conflicting_parameters(case))
        case.call_and_validate(headers=headers, checks=DOCUMENTED if signed else EXACT)

    call()
