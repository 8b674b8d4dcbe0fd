-- What a writer may put in the columns that order delivery, bounded in the
-- table itself, not only in publish(): any role that may INSERT (the writer
-- role of migrate --create-roles included) could otherwise hold a key back for
-- good (deliver_at 'infinity') or go before every other writer's events
-- (priority 2147483647).
--
-- A row trigger on INSERT, not CHECK constraints: the bound on deliver_at is
-- relative to the time of writing, which a CHECK may not be (it must give the
-- same answer for a row at any time), and only what is written is judged, so
-- the rows already in the table, and the relay's updates of them, stay as they
-- were. Adding the trigger changes only the catalog: no scan of the table. The
-- WHEN clause is evaluated inline: the function runs only for a row it
-- refuses, and the insert of any other row costs about what a CHECK costs
-- (docs/performance.md).
--
-- 366 days: publish()'s year (MAX_DELIVER_AHEAD), and a day for the clocks of
-- the writer's host and the database to differ, and for a long transaction.

CREATE OR REPLACE FUNCTION {writer_bounds_func}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.priority NOT BETWEEN -1000 AND 1000 THEN
        RAISE EXCEPTION 'priority % is out of range: from -1000 to 1000', NEW.priority
            USING ERRCODE = 'check_violation', COLUMN = 'priority', TABLE = TG_TABLE_NAME;
    END IF;
    RAISE EXCEPTION 'deliver_at % is not a time at most 366 days from now', NEW.deliver_at
        USING ERRCODE = 'check_violation', COLUMN = 'deliver_at', TABLE = TG_TABLE_NAME;
END
$$;

CREATE TRIGGER {writer_bounds_trigger} BEFORE INSERT ON {table} FOR EACH ROW
    WHEN (NEW.priority NOT BETWEEN -1000 AND 1000
          OR NEW.deliver_at > statement_timestamp() + interval '366 days'
          OR NEW.deliver_at = '-infinity')
    EXECUTE FUNCTION {writer_bounds_func}();

-- publish() asks this when the idempotency key it was given is taken already:
-- whether the event there has the topic it wrote (NULL when it is gone).
-- Another writer of the table may have taken the key first, and the caller's
-- event would be lost without a word. SECURITY DEFINER: writers may not read
-- others' topics; they learn only whether theirs matches. Only the topic: a
-- retry may well carry a recomputed payload, or leave out its key.
CREATE OR REPLACE FUNCTION {same_event_func}(given_idempotency_key text, given_topic text)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT topic = given_topic FROM {table} WHERE idempotency_key = given_idempotency_key
$$;

REVOKE ALL ON FUNCTION {same_event_func}(text, text) FROM PUBLIC;
