-- The relay's own columns, indexes, check and NOTIFY trigger on a Debezium
-- outbox table (id uuid, aggregatetype, aggregateid, type, payload). Nothing
-- here touches the application's columns, and nothing rewrites the table:
-- * columns without a default, or with a constant or stable one (PostgreSQL
--   11 and later), change only the catalog: the rows already there read the
--   default without being written;
-- * relay_state is added with default 'sent', so the rows already there
--   (which Debezium has relayed, or will) are not relayed again, then its
--   default becomes 'pending' for the rows inserted from now on;
-- * relay_seq orders each aggregate's events (the uuid id does not): a
--   sequence default, not an identity column (adding an identity fills every
--   row, a rewrite). Rows already there keep NULL, which only 'sent' allows;
-- * the check is added NOT VALID, then validated by one read of the table
--   under a lock that lets inserts go on;
-- * each index build reads the table once and blocks inserts meanwhile: on a
--   big, busy table create them first with CONCURRENTLY (same statements);
--   this step then skips them.

ALTER TABLE {table}
    ADD COLUMN IF NOT EXISTS relay_seq              bigint,
    ADD COLUMN IF NOT EXISTS relay_state            text        NOT NULL DEFAULT 'sent',
    ADD COLUMN IF NOT EXISTS relay_attempts         integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS relay_last_error       text,
    ADD COLUMN IF NOT EXISTS relay_lease_owner      text,
    ADD COLUMN IF NOT EXISTS relay_claim_token      uuid,
    ADD COLUMN IF NOT EXISTS relay_lease_expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS relay_deliver_at       timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS relay_priority         integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS relay_created_at       timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS relay_published_at     timestamptz,
    ADD COLUMN IF NOT EXISTS relay_failed_at        timestamptz;

-- Room on each page for the claim's HOT update (it changes only lease
-- columns, none of them indexed), as on the native table. It applies to pages
-- written from now on; the pages there stay as they are.
ALTER TABLE {table} SET (fillfactor = 50);

CREATE SEQUENCE IF NOT EXISTS {seq} OWNED BY {table}.relay_seq;

ALTER TABLE {table}
    ALTER COLUMN relay_state SET DEFAULT 'pending',
    ALTER COLUMN relay_seq SET DEFAULT nextval({seq_name}::regclass);

ALTER TABLE {table} ADD CONSTRAINT {state_check} CHECK (
    relay_state IN ('pending', 'sent', 'failed', 'skipped')
    AND (relay_seq IS NOT NULL OR relay_state = 'sent')
) NOT VALID;

ALTER TABLE {table} VALIDATE CONSTRAINT {state_check};

-- The claim's UPDATE and the settles find rows by relay_seq.
CREATE UNIQUE INDEX IF NOT EXISTS {seq_idx} ON {table} (relay_seq);

-- As on the native table (schema.sql), with relay_seq for id and aggregateid for key.
CREATE INDEX IF NOT EXISTS {claim_idx} ON {table} (relay_priority DESC, relay_seq) WHERE relay_state = 'pending';

CREATE INDEX IF NOT EXISTS {key_idx} ON {table} (aggregateid, relay_seq)
    WHERE aggregateid IS NOT NULL AND relay_state IN ('pending', 'failed');

CREATE INDEX IF NOT EXISTS {failed_idx} ON {table} (aggregateid) WHERE relay_state = 'failed';

CREATE OR REPLACE FUNCTION {notify_func}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;

CREATE TRIGGER {notify_trigger} AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_func}({channel});
