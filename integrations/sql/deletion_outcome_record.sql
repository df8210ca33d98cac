-- Recording a broker's deletion outcome (docs/contracts.md §2.2, webhook and ISI alike): the
-- callbacks' hot path, one statement (docs/benchmarks.md, callbacks). services/dispatch/outcomes.py
-- (deletion_outcome_record) calls it and acts on its verdict.
--
-- The request row is locked, then judged, here only:
-- - 'refused': the request is in one of p_refusing_states;
-- - 'repeated': it has this outcome already, and, for an outcome that is not final (one of
--   p_open_outcomes: a failure), the same error message too (a repeat of one failure); or it
--   is a failure while a redispatch waits to be sent (see below);
-- - 'conflict': it has another outcome that is not one of p_open_outcomes;
-- - 'recorded': anything else; a callback can overtake the record of its dispatch's 2xx (or
--   stand in for a 2xx that was lost): the broker evidently has the dispatch.
-- Returned with the request's state and outcome as they were (the caller's 409 names them).
--
-- A redispatch (services/dispatch/redelivery.py) sends a failed request again under the same
-- request_uuid, its outcome cleared, and a callback names no dispatch. Until the redispatch
-- is sent no callback can answer it: a failure then answers the dispatch before, whose
-- failure is on record, and recording it would leave the redispatch unsent. "Not sent yet":
-- no attempt since the request was last queued again (attempts 0), and that was a
-- redispatch, not a redelivery (whose resend may have reached the broker): the row's
-- redispatched_at (set by a redispatch, emptied by a redelivery; migration 0056), read
-- with the row locked here: no other table. Once sent, a stale failure cannot be told from a
-- fresh one and is recorded.
-- services/dispatch/outcomes.py still compares a repeated opted_out's email (encrypted, decrypted
-- there).
--
-- p_details holds the callback's optional details, one key per column it fills (absent: an
-- empty value): error_message, and opt_out_email (already encrypted; absent for none). When
-- recorded, in the same transaction: the opt-out record, the
-- deletion_request.outcome_recorded ledger event (p_event_data, canonical JSON, see
-- ledger_append.sql, with "previous_outcome":null,"previous_state":null in it: filled here
-- from the locked row, since what the caller read before the lock may be stale, a second
-- callback or the dispatch's own record having come in meanwhile; JSON escapes the quotes
-- of any string value, so only those two keys can read so), and the work item's settlement
-- with the rules p_settle_outcomes,
-- p_settle_codes and p_settle_all_cancelled (work_item_settle.sql; the request row is locked
-- first, then its item, as on every path).
-- The rules are not written here: the caller passes them (integrations/models/requests.py
-- OUTCOMES_NOT_FINAL and OUTCOME_REFUSING_STATES, which services/dispatch/resolutions.py applies to a
-- resolution's answer too).
--
-- The source of truth. A migration installs a frozen copy (integrations/migrations/sql/NNNN/),
-- so a change here ships as a new migration with a copy of this file; tests/sql/test_sql_functions.py
-- fails until it does.

CREATE OR REPLACE FUNCTION dropportal_deletion_outcome_record(
    p_request bigint, p_state text, p_outcome text, p_code integer, p_at timestamptz,
    p_details jsonb, p_actor text, p_event_data text,
    p_open_outcomes text[], p_refusing_states text[],
    p_settle_outcomes text[], p_settle_codes integer[], p_settle_all_cancelled integer,
    OUT o_verdict text, OUT o_state text, OUT o_outcome text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_error text := coalesce(p_details ->> 'error_message', '');
    v_error_now text;
    v_item bigint;
    v_broker bigint;
    v_broker_id text;
    v_uuid uuid;
    v_attempts integer;
    v_redispatched_at timestamptz;
BEGIN
    SELECT d.state, d.drop_outcome, d.error_message, d.work_item_id, d.broker_id,
           d.broker_id_code, d.request_uuid, d.attempts, d.redispatched_at
    INTO o_state, o_outcome, v_error_now, v_item, v_broker, v_broker_id, v_uuid, v_attempts,
         v_redispatched_at
    FROM integrations_deletionrequest d WHERE d.id = p_request
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no deletion request %', p_request USING ERRCODE = 'no_data_found';
    END IF;
    IF o_state = ANY (p_refusing_states) THEN
        o_verdict := 'refused';
    ELSIF o_outcome <> ALL (p_open_outcomes) THEN
        o_verdict := CASE WHEN o_outcome = p_outcome THEN 'repeated' ELSE 'conflict' END;
    ELSIF o_outcome = p_outcome AND v_error_now = v_error THEN
        o_verdict := 'repeated';
    ELSIF o_outcome = '' AND p_outcome <> '' AND p_outcome = ANY (p_open_outcomes)
          -- a failure while a redispatch waits to be sent (above)
          AND v_attempts = 0 AND v_redispatched_at IS NOT NULL THEN
        o_verdict := 'repeated';
    ELSE
        o_verdict := 'recorded';
    END IF;
    IF o_verdict <> 'recorded' THEN
        RETURN;
    END IF;
    UPDATE integrations_deletionrequest d
    SET state = p_state, drop_outcome = p_outcome, drop_status_code = p_code,
        error_message = v_error, completed_at = p_at, next_attempt_at = NULL,
        dispatched_at = coalesce(d.dispatched_at, p_at)
    WHERE d.id = p_request;
    IF p_details ? 'opt_out_email' THEN
        INSERT INTO integrations_optoutrecord (deletion_request_id, broker_id, email)
        VALUES (p_request, v_broker, p_details ->> 'opt_out_email');
    END IF;
    PERFORM dropportal_ledger_append(
        p_at, v_broker_id, 'deletion_request.outcome_recorded', v_uuid::text, p_actor,
        replace(p_event_data, '"previous_outcome":null,"previous_state":null',
                '"previous_outcome":' || to_json(o_outcome)::text
                || ',"previous_state":' || to_json(o_state)::text));
    PERFORM dropportal_work_item_settle(
        v_item, 'system', p_settle_outcomes, p_settle_codes, p_settle_all_cancelled);
END;
$$;
