-- Every API call's first query: the active API key with this digest, with its broker; and,
-- for a broker's callback, in the same query, the deletion request of that broker the
-- callback answers, with the secrets of the integration that dispatched it. One round trip
-- with a cached plan, on the callbacks' hot path (docs/benchmarks.md, callbacks).
-- services/staff/keys.py (api_key_lookup) reads the row.
--
-- p_kind names the callback asking, which says how its body names the request, not which
-- kind of integration dispatched it: 'isi' (the ISI callback) by results_token, of a request
-- sent to an ISI connection; any other ('webhook') by request_uuid, of a request that was
-- not; p_correlation NULL: the key alone. No row: no such active key. The
-- request's columns are NULL when the broker has no such request (the caller answers 404
-- after its key and scope checks).
-- The broker's columns are NULL for a metrics key that sees every broker (it has no broker).
--
-- The source of truth. A migration installs a frozen copy (integrations/migrations/sql/NNNN/),
-- so a change here ships as a new migration with a copy of this file; tests/sql/test_sql_functions.py
-- fails until it does.

CREATE OR REPLACE FUNCTION dropportal_api_key_lookup(
    p_digest text, p_kind text, p_correlation text
)
RETURNS TABLE (
    key_id bigint, key_name text, key_prefix text, key_scopes text[],
    key_created_at timestamptz, key_last_used_at timestamptz,
    broker_pk bigint, broker_id text, broker_name text, broker_mode text,
    request_id bigint, request_uuid uuid, request_broker_id_code text,
    request_work_item_id bigint, request_state text, request_drop_outcome text,
    request_round integer,
    integration_id bigint, webhook_secret text, previous_webhook_secret text,
    previous_secret_expires_at timestamptz
)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- One query per kind, so each keeps its own cached plan. The request is found by its
    -- unique key alone, then checked against the key's broker and against the kind of
    -- target it was sent to: the CTE is materialized and holds the key's condition only, so
    -- that no plan, not even one cached while the table was nearly empty, finds it through
    -- another index (the broker's, or isi_connection_id's, which holds every webhook
    -- request as NULL) and reads more of the table the more it holds. No correlation: no
    -- request matches, the key comes alone.
    IF p_kind IS DISTINCT FROM 'isi' THEN
        RETURN QUERY
        WITH answered AS MATERIALIZED (
            SELECT d.id, d.request_uuid, d.broker_id, d.broker_id_code, d.work_item_id,
                   d.state, d.drop_outcome, d.round, d.integration_id, d.isi_connection_id
            FROM integrations_deletionrequest d
            WHERE d.request_uuid = p_correlation::uuid
        )
        SELECT k.id, k.name::text, k.prefix::text, k.scopes::text[], k.created_at,
               k.last_used_at, b.id, b.broker_id::text, b.name::text, b.mode::text,
               a.id, a.request_uuid, a.broker_id_code::text, a.work_item_id,
               a.state::text, a.drop_outcome::text, a.round::integer, i.id, i.webhook_secret,
               i.previous_webhook_secret, i.previous_secret_expires_at
        FROM integrations_apikey k
        LEFT JOIN integrations_broker b ON b.id = k.broker_id
        LEFT JOIN (answered a
                   JOIN integrations_integration i ON i.id = a.integration_id)
            ON a.broker_id = k.broker_id AND a.isi_connection_id IS NULL
        WHERE k.digest = p_digest AND k.revoked_at IS NULL;
    ELSE
        RETURN QUERY
        WITH answered AS MATERIALIZED (
            SELECT d.id, d.request_uuid, d.broker_id, d.broker_id_code, d.work_item_id,
                   d.state, d.drop_outcome, d.round, d.integration_id, d.isi_connection_id
            FROM integrations_deletionrequest d
            WHERE d.results_token = p_correlation
        )
        SELECT k.id, k.name::text, k.prefix::text, k.scopes::text[], k.created_at,
               k.last_used_at, b.id, b.broker_id::text, b.name::text, b.mode::text,
               a.id, a.request_uuid, a.broker_id_code::text, a.work_item_id,
               a.state::text, a.drop_outcome::text, a.round::integer, i.id, i.webhook_secret,
               i.previous_webhook_secret, i.previous_secret_expires_at
        FROM integrations_apikey k
        LEFT JOIN integrations_broker b ON b.id = k.broker_id
        LEFT JOIN (answered a
                   JOIN integrations_integration i ON i.id = a.integration_id)
            ON a.broker_id = k.broker_id AND a.isi_connection_id IS NOT NULL
        WHERE k.digest = p_digest AND k.revoked_at IS NULL;
    END IF;
END;
$$;
