-- Recording a broker's deletion outcome (docs/contracts.md §2.2, webhook and ISI alike): the
-- callbacks' hot path, one statement (docs/benchmarks.md, callbacks). services/outcomes.py
-- (deletion_outcome_record) calls it and answers the rest (the identical repeat, the
-- conflict).
--
-- A new outcome is accepted unless the request is in one of p_refusing_states or already has
-- an outcome that is not one of p_open_outcomes; the same open outcome again with the same
-- error (a repeat of one failure) is a repeat, not a new outcome. A callback can overtake
-- the record of its dispatch's 2xx (or stand in for a 2xx that was lost): the broker
-- evidently has the dispatch. When recorded, in the same transaction: the opt-out record
-- (p_opt_out_email, already encrypted; NULL for none), the
-- deletion_request.outcome_recorded ledger event (p_event_data, canonical JSON, see
-- ledger_append.sql), and the work item's settlement with the rules p_settle_outcomes,
-- p_settle_codes and p_settle_all_cancelled (work_item_settle.sql; the request row is locked
-- first, then its item, as on every path). Returns whether it was recorded.
-- The rules are not written here: the caller passes them (integrations/models/requests.py
-- OUTCOMES_NOT_FINAL and OUTCOME_REFUSING_STATES, which services/resolutions.py applies to a
-- resolution's answer too).
--
-- The source of truth. A migration installs a frozen copy (integrations/migrations/sql/NNNN/),
-- so a change here ships as a new migration with a copy of this file; tests/test_sql_functions.py
-- fails until it does.

CREATE OR REPLACE FUNCTION dropportal_deletion_outcome_record(
    p_request bigint, p_state text, p_outcome text, p_code integer, p_error text,
    p_at timestamptz, p_opt_out_email text, p_actor text, p_event_data text,
    p_open_outcomes text[], p_refusing_states text[],
    p_settle_outcomes text[], p_settle_codes integer[], p_settle_all_cancelled integer
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_item bigint;
    v_broker bigint;
    v_broker_id text;
    v_uuid uuid;
BEGIN
    UPDATE integrations_deletionrequest d
    SET state = p_state, drop_outcome = p_outcome, drop_status_code = p_code,
        error_message = p_error, completed_at = p_at, next_attempt_at = NULL,
        dispatched_at = coalesce(d.dispatched_at, p_at)
    WHERE d.id = p_request AND d.drop_outcome = ANY (p_open_outcomes)
      AND d.state <> ALL (p_refusing_states)
      AND NOT (d.drop_outcome = p_outcome AND d.error_message = p_error)
    RETURNING d.work_item_id, d.broker_id, d.broker_id_code, d.request_uuid
    INTO v_item, v_broker, v_broker_id, v_uuid;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_opt_out_email IS NOT NULL THEN
        INSERT INTO integrations_optoutrecord (deletion_request_id, broker_id, email)
        VALUES (p_request, v_broker, p_opt_out_email);
    END IF;
    PERFORM dropportal_ledger_append(
        p_at, v_broker_id, 'deletion_request.outcome_recorded', v_uuid::text, p_actor,
        p_event_data);
    PERFORM dropportal_work_item_settle(
        v_item, 'system', p_settle_outcomes, p_settle_codes, p_settle_all_cancelled);
    RETURN true;
END;
$$;
