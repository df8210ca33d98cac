-- Which cycles may have outstanding work items (state open or reportable: models/drop.py
-- outstanding_status): integrations_outstandingcycle, one row per such cycle, kept here by
-- triggers on the work items, so every writer keeps it without knowing (the import, the
-- settlement, staff, matching, DROP's removals, the report's marking, tests' factories).
-- Invariant: every work item in state open or reportable has its cycle's row. A row whose
-- cycle has none is allowed: readers then ask their exact question of that cycle.
--
-- Only transitions into outstanding mark: an insert in open or reportable, an update from
-- another state to one of them. Going from one to the other keeps the row (the invariant
-- already holds), and leaving them (the report marking a million rows reported) fires
-- nothing.
--
-- Clearing (services/cycle/outstanding.py, outstanding_cycles_clear) deletes a cycle's row,
-- then in a new statement of the same transaction asks whether the cycle has an outstanding
-- item, and rolls back if it has. Against a transaction moving an item into outstanding:
-- - a mark holds a KEY SHARE lock on the row until its transaction ends, so a DELETE that
--   comes after waits for it, and the clearing's next statement (READ COMMITTED) sees
--   what it committed: the row is kept;
-- - a mark that comes after the DELETE waits in its INSERT ... ON CONFLICT for the
--   clearing to end, then inserts the row again (or, if the clearing rolled back, finds
--   it); if the DELETE commits between the INSERT and the lock, the lock finds nothing
--   and the loop inserts again.
-- KEY SHARE locks never conflict with one another: while a cycle's row exists, its
-- settlements do not wait on each other here. Once it was cleared, the first marker inserts
-- it and every other marker of the cycle waits in its INSERT until that one ends; so a
-- transaction moving items of several cycles into outstanding holds the broker's matching
-- lock (the late match, integration_retire, saas_connection_retire), or two could wait on
-- each other's new rows. The clearing locks no work item, so it cannot deadlock with them
-- (and it waits a second at most: a mark left is always safe).
--
-- The source of truth. A migration installs a frozen copy (integrations/migrations/sql/NNNN/),
-- so a change here ships as a new migration with a copy of this file;
-- tests/sql/test_sql_functions.py fails until it does.

-- Mark one cycle: its row exists, and stays until this transaction ends.
CREATE OR REPLACE FUNCTION dropportal_outstanding_cycle_mark(p_cycle_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        INSERT INTO integrations_outstandingcycle (cycle_id) VALUES (p_cycle_id)
        ON CONFLICT DO NOTHING;
        PERFORM 1 FROM integrations_outstandingcycle WHERE cycle_id = p_cycle_id
        FOR KEY SHARE;
        EXIT WHEN FOUND;  -- else a clearing deleted it and committed in between
    END LOOP;
END
$$;

-- After an INSERT of work items (one call per statement: the import inserts a cycle's
-- million rows in one): each cycle of the new rows with one outstanding, in cycle order.
CREATE OR REPLACE FUNCTION dropportal_outstanding_cycles_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_cycle_id bigint;
BEGIN
    FOR v_cycle_id IN
        SELECT DISTINCT cycle_id FROM inserted_items
        WHERE state IN ('open', 'reportable') ORDER BY cycle_id
    LOOP
        PERFORM dropportal_outstanding_cycle_mark(v_cycle_id);
    END LOOP;
    RETURN NULL;
END
$$;

-- After an UPDATE that moved one work item into outstanding (the trigger's WHEN).
CREATE OR REPLACE FUNCTION dropportal_outstanding_cycle_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM dropportal_outstanding_cycle_mark(NEW.cycle_id);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER integrations_workitem_outstanding_inserted
AFTER INSERT ON integrations_workitem
REFERENCING NEW TABLE AS inserted_items
FOR EACH STATEMENT EXECUTE FUNCTION dropportal_outstanding_cycles_inserted();

CREATE OR REPLACE TRIGGER integrations_workitem_outstanding_updated
AFTER UPDATE OF state ON integrations_workitem
FOR EACH ROW
WHEN (
    OLD.state NOT IN ('open', 'reportable') AND NEW.state IN ('open', 'reportable')
)
EXECUTE FUNCTION dropportal_outstanding_cycle_updated();
