-- A work item's DROP status, settled from its requests' outcomes (docs/contracts.md §1.6).
-- Every outcome settles its work item in its own transaction through
-- dropportal_work_item_settle: the callbacks (deletion_outcome_record.sql), the resolutions
-- and SaaS deletions, and the periodic safety net (services/cycle/work_items.py).
--
-- The rules:
-- - A work item is reportable when every deletion request and resolution request it has,
--   and every SaaS deletion those resolutions started, is final: completed with an outcome
--   that is not failed (a deletion's outcome must also be one of p_outcomes). pending,
--   queued, dispatched, failed and undeliverable keep it open. cancelled ones do not count.
-- - Its code is the strongest outcome: p_outcomes lists the final outcomes strongest first,
--   p_codes their codes. A resolution's opted_out or exempt counts like a deletion outcome;
--   a SaaS deletion only has to be final (its 2xx says the call was taken, not what was
--   found). Every request cancelled: no match remains, so p_all_cancelled. No request at
--   all: not matched yet, nothing to settle (matching gives unmatched items their 5).
-- - A status DROP already has that differs from the new one must be amended
--   (needs_amendment); the reporting service sends it to /data/amend.
-- - Only the match's own requests (round 0) count: a recurring deletion round (round 1, 2...,
--   services/cycle/recurring.py) repeats a deletion DROP already has the status of, and never
--   changes it.
-- - A status staff set by hand (with a written reason) stands while any request is still
--   open; once every request is final, an outcome recorded after it (a round-0 request
--   completed since status_set_at) wins, and the ledger event says it replaced the staff
--   status. Settling again with no such outcome (a recurring round's answer, a retired
--   target's cancellations) leaves it: staff may have set it after everything was final.
-- - Settling to the status the item already has changes nothing: an amendment staff gave
--   up stays given up. Nor does a request still open change a status DROP holds (a late
--   match or a reappearance on a reported 3 or 4): the item stays reported, its recurring
--   rounds go on, and the new answer decides once it is final.
-- Which outcomes are final, which code each reports and which code wins are not written
-- here: the caller passes them (services/cycle/work_items.py settle_rules(), built from
-- integrations/models/requests.py), so they have one home.
--
-- The source of truth. A migration installs a frozen copy (integrations/migrations/sql/NNNN/),
-- so a change here ships as a new migration with a copy of this file; tests/sql/test_sql_functions.py
-- fails until it does.

-- The state and amendment flag that follow from a status code: open without one;
-- reportable until reported; once reported, reportable again (to amend) if DROP holds
-- another code. A removed item stays removed, owing nothing. The one home of this rule:
-- every write of a work item's state or amendment flag goes through it (the settlement
-- below, staff setting a status by hand, matching, DROP taking a file, staff giving up an
-- amendment, DROP removing the item). p_state is the item's state before (NULL: a new
-- row), or 'removed' as DROP removes it.
-- A table of one row, not a record: every caller reads it in a FROM clause, where the planner
-- puts a table function's one SELECT in place of the call. A record-returning SQL function
-- is planned anew at each call instead: a sixth of a settlement's time in the database
-- (docs/benchmarks.md, callbacks) and a per-row call in the bulk updates.
CREATE OR REPLACE FUNCTION dropportal_work_item_status_fields(
    p_state text, p_code integer, p_reported_at timestamptz, p_reported_code integer,
    p_needs_amendment boolean
)
RETURNS TABLE (state text, needs_amendment boolean)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT
        CASE
            WHEN p_state = 'removed' THEN 'removed'
            WHEN p_code IS NULL THEN 'open'
            WHEN p_reported_at IS NULL THEN 'reportable'
            WHEN p_reported_code IS DISTINCT FROM p_code THEN 'reportable'
            ELSE 'reported'
        END,
        CASE
            WHEN p_state = 'removed' THEN false
            -- Waiting for an outcome: an amendment flag (a late match on a reported 5)
            -- stays until the outcome decides.
            WHEN p_code IS NULL THEN p_needs_amendment
            WHEN p_reported_at IS NULL THEN false
            -- reported_status_code NULL with reported_at set: an amendment DROP rejected,
            -- so DROP holds the earlier code; amend again.
            ELSE p_reported_code IS DISTINCT FROM p_code
        END
$$;

-- Lock the work item, recompute its status from its requests, store it and append a
-- work_item.status_settled ledger event when it changes. Returns the item's status as
-- stored, with what DROP holds (no row: no such work item).
CREATE OR REPLACE FUNCTION dropportal_work_item_settle(
    p_item bigint, p_actor text, p_outcomes text[], p_codes integer[], p_all_cancelled integer
)
RETURNS TABLE (status_code integer, state text, needs_amendment boolean,
               status_reason text, reported_status_code integer, reported_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    wi record;
    v_code integer;
    v_open boolean;
    v_rows bigint;
    v_counted bigint;
    v_fields record;
    v_replaces_staff boolean;
    v_last_final timestamptz;
    v_at timestamptz := clock_timestamp();
BEGIN
    SELECT w.work_item_id, w.state, w.status_code, w.status_reason, w.status_set_at,
           w.needs_amendment, w.reported_at, w.reported_status_code, b.broker_id,
           c.drop_session_id
    INTO wi
    FROM integrations_workitem w
    JOIN integrations_broker b ON b.id = w.broker_id
    JOIN integrations_dropcycle c ON c.id = w.cycle_id
    WHERE w.id = p_item
    FOR UPDATE OF w;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF wi.state = 'removed' THEN
        RETURN QUERY SELECT wi.status_code::integer, wi.state::text,
            wi.needs_amendment, wi.status_reason, wi.reported_status_code::integer,
            wi.reported_at;
        RETURN;
    END IF;

    -- Its own statement, so it reads with a snapshot taken once the lock is held: two
    -- outcomes recorded at once for two requests of one item cannot both see the other
    -- still open.
    SELECT count(*),
           count(*) FILTER (WHERE r.state <> 'cancelled'),
           coalesce(bool_or(r.state <> 'cancelled' AND (
               r.state <> 'completed' OR r.outcome = 'failed'
               OR (r.kind = 'deletion' AND r.outcome <> ALL (p_outcomes))
           )), false),
           p_codes[min(
               CASE WHEN r.state <> 'cancelled' AND r.kind IN ('deletion', 'resolution')
                    THEN array_position(p_outcomes, r.outcome::text)
               END)],
           max(r.completed_at) FILTER (WHERE r.state = 'completed')
    INTO v_rows, v_counted, v_open, v_code, v_last_final
    FROM (
        SELECT 'deletion' AS kind, d.state, d.drop_outcome AS outcome, d.completed_at
        FROM integrations_deletionrequest d WHERE d.work_item_id = p_item AND d.round = 0
        UNION ALL
        SELECT 'resolution', r.state, r.drop_outcome, r.completed_at
        FROM integrations_resolutionrequest r WHERE r.work_item_id = p_item AND r.round = 0
        UNION ALL
        SELECT 'saas', s.state, '', s.completed_at
        FROM integrations_saasdeletion s
        JOIN integrations_resolutionrequest r ON r.id = s.resolution_id
        WHERE r.work_item_id = p_item AND r.round = 0
    ) r;
    IF v_rows = 0 OR v_open THEN
        v_code := NULL;
    ELSIF v_counted = 0 THEN
        v_code := p_all_cancelled;
    END IF;  -- else the strongest outcome, or NULL: no deletion outcome yet

    IF v_code IS NULL AND (wi.status_reason <> '' OR wi.status_code IS NULL
                           OR wi.state = 'reported') THEN
        -- still open; a status set by staff stands meanwhile, and so does one DROP holds
        -- (a consumer matched later or come back is asked; its answer decides)
        RETURN QUERY SELECT wi.status_code::integer, wi.state::text,
            wi.needs_amendment, wi.status_reason, wi.reported_status_code::integer,
            wi.reported_at;
        RETURN;
    END IF;
    v_replaces_staff := wi.status_reason <> '' AND v_code IS NOT NULL
        AND coalesce(v_last_final > coalesce(wi.status_set_at, '-infinity'), false);
    -- A staff status no outcome came after stands. The state and flag follow from a status
    -- as it changes. With the status unchanged they stand as stored: staff may have given
    -- up an amendment of it (report_manual.py), and settling again, as a recurring round's
    -- outcome does, must not bring it back.
    IF NOT v_replaces_staff
       AND (wi.status_reason <> '' OR v_code IS NOT DISTINCT FROM wi.status_code::integer) THEN
        RETURN QUERY SELECT wi.status_code::integer, wi.state::text,
            wi.needs_amendment, wi.status_reason, wi.reported_status_code::integer,
            wi.reported_at;
        RETURN;
    END IF;
    SELECT * INTO v_fields FROM dropportal_work_item_status_fields(
        wi.state, v_code, wi.reported_at, wi.reported_status_code, wi.needs_amendment);

    UPDATE integrations_workitem w
    SET status_code = v_code, state = v_fields.state, needs_amendment = v_fields.needs_amendment,
        status_reason = CASE WHEN v_code IS NULL THEN w.status_reason ELSE '' END,
        status_set_at = CASE WHEN v_code IS NULL THEN w.status_set_at END,
        updated_at = v_at
    WHERE w.id = p_item;
    -- The event's data in canonical form (see ledger_append.sql): keys sorted.
    PERFORM dropportal_ledger_append(
        v_at, wi.broker_id, 'work_item.status_settled', wi.work_item_id, p_actor,
        '{"cycle":' || to_json(wi.drop_session_id::text)::text
        || ',"needs_amendment":' || v_fields.needs_amendment::text
        || ',"previous_status_code":' || coalesce(wi.status_code::text, 'null')
        || CASE WHEN v_replaces_staff THEN
               ',"replaced_staff_status":{"reason":' || to_json(wi.status_reason)::text
               || ',"status_code":' || coalesce(wi.status_code::text, 'null') || '}'
           ELSE '' END
        || ',"state":' || to_json(v_fields.state)::text
        || ',"status_code":' || coalesce(v_code::text, 'null')
        || '}'
    );
    RETURN QUERY SELECT v_code, v_fields.state, v_fields.needs_amendment,
        CASE WHEN v_code IS NULL THEN wi.status_reason ELSE ''::text END,
        wi.reported_status_code::integer, wi.reported_at;
END;
$$;
