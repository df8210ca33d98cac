-- Writing a ledger event, in the database: every write path appends through these, the
-- Python ones (services/ledger.py, ledger_events_append) and the SQL ones
-- (work_item_settle.sql, deletion_outcome_record.sql) alike, so there is one writer of
-- event hashes. ledger_verify (services/ledger.py, event_hash) recomputes them on its own,
-- in Python, from what is stored: the two must agree, and the tests hold them to it.
--
-- The hash is SHA-256 (hex) over the event's canonical content: a JSON object with the keys
-- actor, broker_id, created_at (UTC, microseconds, "+00:00"), data, kind and subject, in that
-- order, no whitespace, non-ASCII characters as they are. p_data is the event's data already
-- in that canonical form (Python's json.dumps(sort_keys=True, separators=(",", ":"),
-- ensure_ascii=False)); PostgreSQL's to_json escapes a string exactly as json.dumps does.
--
-- The source of truth. A migration installs a frozen copy (integrations/migrations/sql/NNNN/),
-- so a change here ships as a new migration with a copy of this file; tests/sql/test_sql_functions.py
-- fails until it does.

CREATE OR REPLACE FUNCTION dropportal_ledger_event_hash(
    p_created_at timestamptz, p_broker_id text, p_kind text, p_subject text, p_actor text,
    p_data text
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(convert_to(
        '{"actor":' || to_json(p_actor)::text
        || ',"broker_id":' || to_json(p_broker_id)::text
        || ',"created_at":"'
        || to_char(p_created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00"'
        || ',"data":' || p_data
        || ',"kind":' || to_json(p_kind)::text
        || ',"subject":' || to_json(p_subject)::text
        || '}', 'UTF8')), 'hex')
$$;

-- One event, for the SQL write paths (subject and actor cut at 200 characters, as the
-- columns are).
CREATE OR REPLACE FUNCTION dropportal_ledger_append(
    p_created_at timestamptz, p_broker_id text, p_kind text, p_subject text, p_actor text,
    p_data text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO integrations_ledgerevent
        (created_at, broker_id, kind, subject, actor, data, event_hash)
    VALUES (
        p_created_at, p_broker_id, p_kind, left(p_subject, 200), left(p_actor, 200),
        p_data::jsonb,
        dropportal_ledger_event_hash(
            p_created_at, p_broker_id, p_kind, left(p_subject, 200), left(p_actor, 200), p_data
        )
    )
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;
