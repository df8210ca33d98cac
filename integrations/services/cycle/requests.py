"""Creating the requests a DROP match hands to the broker's systems, in bulk, in SQL.

Matching (``integrations.services.cycle.matching``) writes its (work item, consumer) pairs into the
per-transaction temp table ``drop_matches``; one call turns them into deletion requests and
defers their delivery jobs in the same transaction::

    with transaction.atomic():
        matches_table_create()
        cursor.execute("INSERT INTO drop_matches (work_item_id, consumer_id, late_match) ...")
        created = requests_create_for_matches(broker=broker, match_date=today, actor="system")

Deletion targets (docs/contracts.md §1.3): every integration of the broker that is not
retired and whose kind's transport builds its requests' messages (today each webhook
integration), and every ISI connection that takes part in DROP (listed, with both DROP
capabilities, of an ISI integration that is not retired). A disabled target is paused, not
gone: it gets its requests, which wait (the delivery loop holds them, no attempt is made)
until it is enabled, and their work items owe their status until they are answered. Each
matched consumer gets one request per target (state ``queued``, delivery job deferred);
with no target yet it gets one request with none (state ``pending``: it waits until a
target is configured).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from integrations.dispatch.transports import direct_target_kinds, resolving_kinds
from integrations.enqueue import deletion_requests_enqueue, resolution_requests_enqueue
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    DROP_CAPABILITIES,
    Broker,
    IntegrationKind,
    RequestState,
    WorkItemState,
)
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock

MATCHES_TABLE = "drop_matches"


@dataclass(frozen=True)
class RequestsCreated:
    """What ``requests_create_for_matches`` did."""

    matches: int  # (work item, consumer) pairs read
    deletion_requests: int
    queued: int  # with a target, delivery job deferred
    pending: int  # no target configured yet
    targets: int
    late: int  # requests marked late_match
    resolution_requests: int = 0  # only with a SaaS connection (not retired); queued at once


def matches_table_create() -> None:
    """(Re)create the empty temp table ``drop_matches`` for this transaction.

    Columns: ``work_item_id`` (``integrations_workitem.id``), ``consumer_id``, ``late_match``,
    and for a recurring round (``services.cycle.recurring``) its ``round`` and the original
    match's ``match_date``, ``mode`` and ``broker_id_code`` (NULL: the call's, the broker's
    now). It is dropped at commit; dropping first lets one
    transaction match more than once.
    """
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {MATCHES_TABLE}")
        cursor.execute(
            f"CREATE TEMP TABLE {MATCHES_TABLE} ("
            " work_item_id bigint NOT NULL,"
            " consumer_id bigint NOT NULL,"
            " late_match boolean NOT NULL DEFAULT false,"
            " round smallint NOT NULL DEFAULT 0,"
            " match_date date,"
            " mode varchar(10),"
            " broker_id_code varchar(4)"
            ") ON COMMIT DROP"
        )


# The targets, as (integration id, ISI connection id) rows, with whether each is asked for
# identifiers too: every integration of a kind whose transport builds its requests' messages
# (dispatch.transports.direct_target_kinds: today the webhook), and the connections of ISI
# integrations that take part (IsiConnection.takes_part_in_drop, written in SQL). A new
# kind of target is a target here once its transport is registered. Disabled ones
# included: only retiring ends a target (a request not made while it was paused would
# never be made).
_TARGETS_SQL = """
    SELECT i.id AS integration_id, NULL::bigint AS isi_connection_id,
           i.kind = ANY(%(resolving_kinds)s) AS resolves
      FROM integrations_integration i
     WHERE i.broker_id = %(broker)s AND i.kind = ANY(%(direct_target_kinds)s)
       AND i.retired_at IS NULL
    UNION ALL
    SELECT i.id, c.id, i.kind = ANY(%(resolving_kinds)s)
      FROM integrations_isiconnection c
      JOIN integrations_integration i ON i.id = c.integration_id
     WHERE i.broker_id = %(broker)s AND i.kind = %(isi)s AND i.retired_at IS NULL
       AND c.listed AND c.capabilities @> %(capabilities)s::varchar[]
"""


def _targets_params(broker: Broker) -> dict[str, Any]:
    """What ``_TARGETS_SQL`` reads, from the transports registered now."""
    return {
        "broker": broker.pk,
        "direct_target_kinds": direct_target_kinds(),
        "resolving_kinds": resolving_kinds(),
        "isi": IntegrationKind.ISI,
        "capabilities": list(DROP_CAPABILITIES),
    }


# A results_token (ISI only; resolutions always): SHA-256 over three v4 UUIDs from
# PostgreSQL's strong random source (366 random bits), as 64 lower-case hex characters,
# without needing pgcrypto. Every path that gives a request a token builds it with this.
_RESULTS_TOKEN = (
    "encode(sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text"  # noqa: S105
    " || gen_random_uuid()::text, 'UTF8')), 'hex')"
)

# One row per match and target; LEFT JOIN ... ON true keeps a match with no target as one
# row whose target is NULL (a pending request). Every dispatch-body field is fixed here.
_INSERT_SQL = f"""
    WITH targets AS ({_TARGETS_SQL})
    INSERT INTO integrations_deletionrequest (
        state, attempts, next_attempt_at, last_error, dispatched_at, completed_at,
        request_uuid, webhook_request_id, results_token,
        broker_id, work_item_id, consumer_id, integration_id, isi_connection_id,
        identifier_hash, hash_type, drop_session_id, match_date, broker_id_code, mode,
        remote_identifier, remote_identifier_kind, late_match, round,
        drop_outcome, drop_status_code, error_message
    )
    SELECT
        CASE WHEN t.integration_id IS NULL THEN %(pending)s ELSE %(queued)s END,
        0,
        CASE WHEN t.integration_id IS NULL THEN NULL ELSE now() END,
        '', NULL, NULL,
        gen_random_uuid(), gen_random_uuid(),
        CASE WHEN t.isi_connection_id IS NULL THEN NULL ELSE {_RESULTS_TOKEN} END,
        %(broker)s, w.id, co.id, t.integration_id, t.isi_connection_id,
        encode(w.hash, 'base64'), w.hash_type, cy.drop_session_id,
        coalesce(m.match_date, %(match_date)s), coalesce(m.broker_id_code, %(broker_id_code)s),
        coalesce(m.mode, %(mode)s),
        co.remote_identifier, co.remote_identifier_kind, m.late_match, m.round,
        '', NULL, ''
      FROM {MATCHES_TABLE} m
      JOIN integrations_workitem w ON w.id = m.work_item_id
      JOIN integrations_dropcycle cy ON cy.id = w.cycle_id
      JOIN integrations_consumer co ON co.id = m.consumer_id
      LEFT JOIN targets t ON true
     WHERE w.broker_id = %(broker)s
    RETURNING id, integration_id IS NOT NULL, late_match
"""  # noqa: S608


# Resolution (docs/contracts.md §1.4): only when the broker has a SaaS connection that is not
# retired (a disabled one waits for its deletions, it does not lose them), one identifier
# retrieval request per match and resolving target: the deletion targets whose kind's
# transport resolves (each webhook integration, each ISI connection taking part, which has
# the privacy/drop/identifiers capability). Each has its results_token (_RESULTS_TOKEN).
# Every notification-body field is fixed here, as the deletion requests' are.
_RESOLUTION_INSERT_SQL = f"""
    WITH targets AS ({_TARGETS_SQL})
    INSERT INTO integrations_resolutionrequest (
        state, attempts, next_attempt_at, last_error, dispatched_at, completed_at,
        request_uuid, webhook_request_id, results_token,
        broker_id, work_item_id, consumer_id, integration_id, isi_connection_id,
        drop_session_id, match_date, broker_id_code, mode,
        remote_identifier, remote_identifier_kind, round,
        drop_outcome, exemption_basis, identifiers, identifiers_purged_at
    )
    SELECT
        %(queued)s, 0, now(), '', NULL, NULL,
        gen_random_uuid(), gen_random_uuid(),
        {_RESULTS_TOKEN},
        %(broker)s, w.id, co.id, t.integration_id, t.isi_connection_id,
        cy.drop_session_id, coalesce(m.match_date, %(match_date)s),
        coalesce(m.broker_id_code, %(broker_id_code)s), coalesce(m.mode, %(mode)s),
        co.remote_identifier, co.remote_identifier_kind, m.round,
        '', '', '', NULL
      FROM {MATCHES_TABLE} m
      JOIN integrations_workitem w ON w.id = m.work_item_id
      JOIN integrations_dropcycle cy ON cy.id = w.cycle_id
      JOIN integrations_consumer co ON co.id = m.consumer_id
      JOIN targets t ON t.resolves
     WHERE w.broker_id = %(broker)s
       AND EXISTS (SELECT 1 FROM integrations_saasconnection s
                    WHERE s.broker_id = %(broker)s AND s.retired_at IS NULL)
    RETURNING id
"""  # noqa: S608


def requests_create_for_matches(
    *, broker: Broker, match_date: dt.date, actor: str
) -> RequestsCreated:
    """Create the deletion requests for every row of ``drop_matches`` and queue delivery.

    Call it inside the transaction that filled ``drop_matches`` (see
    ``matches_table_create``). Requests and their delivery jobs commit together: a
    rolled-back caller leaves neither. ``match_date`` is the date of the match; the
    session id comes from each work item's cycle. Rows of another broker's work items
    are ignored.
    """
    with transaction.atomic():
        result = requests_insert_for_matches(broker=broker, match_date=match_date)
        if not result.matches:
            return result
        ledger_event_append(
            kind=LedgerKind.DELETION_REQUESTS_CREATED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={
                "matches": result.matches,
                "deletion_requests": result.deletion_requests,
                "queued": result.queued,
                "pending": result.pending,
                "targets": result.targets,
                "late": result.late,
                "resolution_requests": result.resolution_requests,
                "match_date": match_date.isoformat(),
            },
        )
    return result


def requests_insert_for_matches(*, broker: Broker, match_date: dt.date) -> RequestsCreated:
    """The requests of ``requests_create_for_matches`` and their delivery jobs, without its
    ledger event: a caller that is not a match (a recurring round) writes its own."""
    params: dict[str, Any] = {
        **_targets_params(broker),
        "pending": RequestState.PENDING,
        "queued": RequestState.QUEUED,
        "match_date": match_date,
        "broker_id_code": broker.broker_id,
        "mode": broker.mode,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {MATCHES_TABLE}")  # noqa: S608
        matches = int(cursor.fetchone()[0])
        if not matches:
            return RequestsCreated(0, 0, 0, 0, 0, 0)
        cursor.execute(f"SELECT count(*) FROM ({_TARGETS_SQL}) t", params)  # noqa: S608
        targets = int(cursor.fetchone()[0])
        cursor.execute(_INSERT_SQL, params)
        created = cursor.fetchall()
        queued_ids = sorted(request_id for request_id, queued, _ in created if queued)
        late = sum(1 for _, _, late_match in created if late_match)
        if queued_ids:
            deletion_requests_enqueue(queued_ids)
        cursor.execute(_RESOLUTION_INSERT_SQL, params)
        resolution_ids = sorted(row[0] for row in cursor.fetchall())
        if resolution_ids:
            resolution_requests_enqueue(resolution_ids)
    return RequestsCreated(
        matches=matches,
        deletion_requests=len(created),
        queued=len(queued_ids),
        pending=len(created) - len(queued_ids),
        targets=targets,
        late=late,
        resolution_requests=len(resolution_ids),
    )


# -- targets that became available ------------------------------------------------------------

# The broker's requests that wait for a target, of work items DROP has not removed.
_PENDING_SQL = """
    SELECT d.id
      FROM integrations_deletionrequest d
      JOIN integrations_workitem w ON w.id = d.work_item_id
     WHERE d.broker_id = %(broker)s AND d.state = %(pending)s AND d.integration_id IS NULL
       AND w.state <> %(removed)s
     ORDER BY d.id
       FOR UPDATE OF d
"""

# Every target but the first gets a copy of each waiting request, with the fields the match
# fixed (session, match date, pointer, late_match) and its own ids.
_PENDING_COPY_SQL = f"""
    INSERT INTO integrations_deletionrequest (
        state, attempts, next_attempt_at, last_error, dispatched_at, completed_at,
        request_uuid, webhook_request_id, results_token,
        broker_id, work_item_id, consumer_id, integration_id, isi_connection_id,
        identifier_hash, hash_type, drop_session_id, match_date, broker_id_code, mode,
        remote_identifier, remote_identifier_kind, late_match, round, matched_at,
        drop_outcome, drop_status_code, error_message
    )
    SELECT %(queued)s, 0, now(), '', NULL, NULL,
        gen_random_uuid(), gen_random_uuid(),
        CASE WHEN t.isi_connection_id IS NULL THEN NULL ELSE {_RESULTS_TOKEN} END,
        d.broker_id, d.work_item_id, d.consumer_id, t.integration_id, t.isi_connection_id,
        d.identifier_hash, d.hash_type, d.drop_session_id, d.match_date, d.broker_id_code,
        d.mode, d.remote_identifier, d.remote_identifier_kind, d.late_match, d.round,
        d.matched_at, '', NULL, ''
      FROM integrations_deletionrequest d
     CROSS JOIN unnest(%(other_integrations)s::bigint[], %(other_connections)s::bigint[])
           AS t(integration_id, isi_connection_id)
     WHERE d.id = ANY(%(pending_ids)s)
    RETURNING id
"""  # noqa: S608

# The first target takes each waiting row itself.
_PENDING_TAKE_SQL = f"""
    UPDATE integrations_deletionrequest
       SET state = %(queued)s, next_attempt_at = now(), integration_id = %(first_integration)s,
           isi_connection_id = %(first_connection)s,
           results_token = CASE WHEN %(first_connection)s::bigint IS NULL THEN NULL
                                ELSE {_RESULTS_TOKEN} END
     WHERE id = ANY(%(pending_ids)s)
"""  # noqa: S608

# The identifier retrievals the match would have created (only with a SaaS connection not
# retired): one per deletion request just targeted, unless one exists for that
# (work item, consumer, target) already. Its body's fields are the deletion request's, which
# the match fixed (the broker's mode then, not now).
_PENDING_RESOLUTIONS_SQL = f"""
    INSERT INTO integrations_resolutionrequest (
        state, attempts, next_attempt_at, last_error, dispatched_at, completed_at,
        request_uuid, webhook_request_id, results_token,
        broker_id, work_item_id, consumer_id, integration_id, isi_connection_id,
        drop_session_id, match_date, broker_id_code, mode,
        remote_identifier, remote_identifier_kind, round,
        drop_outcome, exemption_basis, identifiers, identifiers_purged_at
    )
    SELECT %(queued)s, 0, now(), '', NULL, NULL,
        gen_random_uuid(), gen_random_uuid(), {_RESULTS_TOKEN},
        d.broker_id, d.work_item_id, d.consumer_id, d.integration_id, d.isi_connection_id,
        d.drop_session_id, d.match_date, d.broker_id_code, d.mode,
        d.remote_identifier, d.remote_identifier_kind, d.round,
        '', '', '', NULL
      FROM integrations_deletionrequest d
      JOIN integrations_integration i ON i.id = d.integration_id
     WHERE d.id = ANY(%(targeted_ids)s) AND i.kind = ANY(%(resolving_kinds)s)
       AND EXISTS (SELECT 1 FROM integrations_saasconnection s
                    WHERE s.broker_id = %(broker)s AND s.retired_at IS NULL)
       AND NOT EXISTS (
           SELECT 1 FROM integrations_resolutionrequest r
            WHERE r.work_item_id = d.work_item_id
              AND r.consumer_id IS NOT DISTINCT FROM d.consumer_id
              AND r.round = d.round
              AND r.integration_id = d.integration_id
              AND r.isi_connection_id IS NOT DISTINCT FROM d.isi_connection_id)
    RETURNING id
"""  # noqa: S608


@dataclass(frozen=True)
class PendingRequestsTargeted:
    """What ``pending_requests_target`` did."""

    pending: int  # requests that waited for a target
    targets: int
    deletion_requests_queued: int  # the waiting rows and their copies for further targets
    resolution_requests: int  # queued at once; only with a SaaS connection not retired


def pending_requests_target(*, broker: Broker, actor: str) -> PendingRequestsTargeted:
    """Give every request of ``broker`` that waits for a target (state ``pending``) the
    broker's deletion targets, as matching would have had they been there, and queue them.

    The first target takes each waiting row, every other target gets a copy; each such
    request gets its identifier retrieval when the broker has a SaaS connection not retired.
    Call it whenever a target becomes available (an integration created or enabled, an ISI
    connection list refreshed, another target retired); it does nothing while the broker has
    no target. One
    transaction (a savepoint inside the caller's), serialized with matching for the broker,
    so a match made meanwhile is either seen here or sees the target itself.
    """
    params: dict[str, Any] = {
        **_targets_params(broker),
        "pending": RequestState.PENDING,
        "queued": RequestState.QUEUED,
        "removed": WorkItemState.REMOVED,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        matching_lock(broker=broker)
        cursor.execute(_PENDING_SQL, params)
        pending_ids = [row[0] for row in cursor.fetchall()]
        if not pending_ids:
            return PendingRequestsTargeted(0, 0, 0, 0)
        cursor.execute(
            f"SELECT integration_id, isi_connection_id FROM ({_TARGETS_SQL}) t"  # noqa: S608
            " ORDER BY integration_id, isi_connection_id NULLS FIRST",
            params,
        )
        targets = cursor.fetchall()
        if not targets:
            return PendingRequestsTargeted(len(pending_ids), 0, 0, 0)
        (first_integration, first_connection), others = targets[0], targets[1:]
        params.update(
            pending_ids=pending_ids,
            first_integration=first_integration,
            first_connection=first_connection,
            other_integrations=[integration for integration, _ in others],
            other_connections=[isi_connection for _, isi_connection in others],
        )
        copies: list[int] = []
        if others:
            cursor.execute(_PENDING_COPY_SQL, params)
            copies = [row[0] for row in cursor.fetchall()]
        cursor.execute(_PENDING_TAKE_SQL, params)
        targeted = sorted(pending_ids + copies)
        deletion_requests_enqueue(targeted)
        params["targeted_ids"] = targeted
        cursor.execute(_PENDING_RESOLUTIONS_SQL, params)
        resolution_ids = sorted(row[0] for row in cursor.fetchall())
        if resolution_ids:
            resolution_requests_enqueue(resolution_ids)
        result = PendingRequestsTargeted(
            pending=len(pending_ids),
            targets=len(targets),
            deletion_requests_queued=len(targeted),
            resolution_requests=len(resolution_ids),
        )
        ledger_event_append(
            kind=LedgerKind.PENDING_REQUESTS_TARGETED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={
                "pending": result.pending,
                "targets": result.targets,
                "deletion_requests_queued": result.deletion_requests_queued,
                "resolution_requests": result.resolution_requests,
            },
        )
    return result


# -- a target retired ---------------------------------------------------------------------------

# Each (work item, consumer) of the cancelled requests that has no request left but
# cancelled ones gets one waiting for a target, with the fields the match fixed: cancelled by
# a retirement is not "no match" (which settles to 5), the consumer is still owed a deletion.
_WAIT_FOR_TARGET_SQL = """
    INSERT INTO integrations_deletionrequest (
        state, attempts, next_attempt_at, last_error, dispatched_at, completed_at,
        request_uuid, webhook_request_id, results_token,
        broker_id, work_item_id, consumer_id, integration_id, isi_connection_id,
        identifier_hash, hash_type, drop_session_id, match_date, broker_id_code, mode,
        remote_identifier, remote_identifier_kind, late_match, round, matched_at,
        drop_outcome, drop_status_code, error_message
    )
    SELECT DISTINCT ON (d.work_item_id, d.consumer_id, d.round)
        %(pending)s, 0, NULL, '', NULL, NULL,
        gen_random_uuid(), gen_random_uuid(), NULL,
        d.broker_id, d.work_item_id, d.consumer_id, NULL, NULL,
        d.identifier_hash, d.hash_type, d.drop_session_id, d.match_date, d.broker_id_code,
        d.mode, d.remote_identifier, d.remote_identifier_kind, d.late_match, d.round,
        d.matched_at, '', NULL, ''
      FROM integrations_deletionrequest d
      JOIN integrations_workitem w ON w.id = d.work_item_id
     WHERE d.id = ANY(%(cancelled_ids)s) AND w.state <> %(removed)s
       AND NOT EXISTS (
           SELECT 1 FROM integrations_deletionrequest o
            WHERE o.work_item_id = d.work_item_id
              AND o.consumer_id IS NOT DISTINCT FROM d.consumer_id
              AND o.round = d.round
              AND o.state <> %(cancelled)s)
     ORDER BY d.work_item_id, d.consumer_id, d.round, d.id
    RETURNING id
"""


def cancelled_requests_wait_for_target(*, cancelled_ids: list[int]) -> int:
    """After a target is retired: give each match whose requests are all cancelled now one
    request waiting for a target (``pending``), so its work item stays owed instead of
    settling as if nothing had matched. Returns how many were created; the caller then runs
    ``pending_requests_target`` in its transaction, which gives them the targets left."""
    if not cancelled_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            _WAIT_FOR_TARGET_SQL,
            {
                "cancelled_ids": cancelled_ids,
                "pending": RequestState.PENDING,
                "cancelled": RequestState.CANCELLED,
                "removed": WorkItemState.REMOVED,
            },
        )
        return cursor.rowcount


# -- canary rounds ------------------------------------------------------------------------------

# Each canary registered now, with the identifier hash its requests carry: one per consumer,
# the same each round (the first by list type, then by hash). A canary whose consumer is not
# registered, or has no hash, is not here.
_CANARIES_SQL = """
    SELECT DISTINCT ON (co.id) co.id AS consumer_id, co.remote_identifier,
           co.remote_identifier_kind, ch.hash, ch.hash_type
      FROM integrations_consumer co
      JOIN integrations_consumerhash ch ON ch.consumer_id = co.id AND ch.broker_id = co.broker_id
     WHERE co.broker_id = %(broker)s AND co.remote_identifier = ANY(%(remote_identifiers)s)
     ORDER BY co.id, ch.hash_type, ch.hash
"""

# One request per canary and target, with the dispatch body of a match (docs/contracts.md
# §2.1), its drop_session_id the canary session's; it belongs to the round, not to a work
# item. No identifier retrieval: a canary tests the broker's own deletion, and SaaS
# deletions of a test record would reach third parties.
_CANARY_INSERT_SQL = f"""
    WITH targets AS ({_TARGETS_SQL}), canaries AS ({_CANARIES_SQL})
    INSERT INTO integrations_deletionrequest (
        state, attempts, next_attempt_at, last_error, dispatched_at, completed_at,
        request_uuid, webhook_request_id, results_token,
        broker_id, work_item_id, canary_round_id, consumer_id, integration_id,
        isi_connection_id, identifier_hash, hash_type, drop_session_id, match_date,
        broker_id_code, mode, remote_identifier, remote_identifier_kind, late_match, round,
        drop_outcome, drop_status_code, error_message
    )
    SELECT %(queued)s, 0, now(), '', NULL, NULL,
        gen_random_uuid(), gen_random_uuid(),
        CASE WHEN t.isi_connection_id IS NULL THEN NULL ELSE {_RESULTS_TOKEN} END,
        %(broker)s, NULL, %(canary_round)s, c.consumer_id, t.integration_id,
        t.isi_connection_id, encode(c.hash, 'base64'), c.hash_type, %(session)s, %(match_date)s,
        %(broker_id_code)s, %(mode)s, c.remote_identifier, c.remote_identifier_kind, false, 0,
        '', NULL, ''
      FROM canaries c CROSS JOIN targets t
     ORDER BY c.remote_identifier, t.integration_id, t.isi_connection_id
    RETURNING id
"""  # noqa: S608


@dataclass(frozen=True)
class CanaryRequestsCreated:
    """What ``canary_requests_create`` did."""

    canaries: list[str]  # the remote identifiers sent, each to every target
    missing: list[str]  # named, but not registered with a hash: nothing sent
    targets: int
    deletion_requests: int


def canary_requests_create(
    *,
    broker: Broker,
    canary_round_id: int,
    remote_identifiers: list[str],
    session_id: str,
    match_date: dt.date,
) -> CanaryRequestsCreated:
    """The requests of a canary round (``services.cycle.canaries``): one per canary and
    deletion target, queued with their delivery jobs in the caller's transaction. A paused
    target's wait in the delivery loop like any other; with no target, none is made."""
    params: dict[str, Any] = {
        **_targets_params(broker),
        "queued": RequestState.QUEUED,
        "remote_identifiers": remote_identifiers,
        "canary_round": canary_round_id,
        "session": session_id,
        "match_date": match_date,
        "broker_id_code": broker.broker_id,
        "mode": broker.mode,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT remote_identifier FROM ({_CANARIES_SQL}) c", params)  # noqa: S608
        registered = sorted(row[0] for row in cursor.fetchall())
        cursor.execute(f"SELECT count(*) FROM ({_TARGETS_SQL}) t", params)  # noqa: S608
        targets = int(cursor.fetchone()[0])
        cursor.execute(_CANARY_INSERT_SQL, params)
        created = sorted(row[0] for row in cursor.fetchall())
        if created:
            deletion_requests_enqueue(created)
    return CanaryRequestsCreated(
        canaries=registered,
        missing=sorted(set(remote_identifiers) - set(registered)),
        targets=targets,
        deletion_requests=len(created),
    )
