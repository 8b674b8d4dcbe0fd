-- Lease columns that never change width (issue 39): a claim's lease UPDATE
-- then overwrites each row where it is. Set from NULL, the token, the owner
-- and the expiry grew the row, which InnoDB cannot do in place: it deletes
-- the record and inserts it again, and that made the lease UPDATE the dearest
-- step of a claim (docs/mysql.md, "Lease columns of a fixed width").
--
-- No lease is now lease_expires_at = '1000-01-01 00:00:00' (the smallest
-- DATETIME, before every clock: "expired" and "not live" hold for it as they
-- did for NULL), claim_token = '' (CHAR(36) of ascii: always 36 bytes) and
-- lease_owner = '' (CHAR(80) of utf8mb4: InnoDB keeps at least 80 bytes for
-- it, so any owner of up to 80 bytes has the width of ''). The relay cuts its
-- owner to 80 characters.
--
-- Online on both servers, in three statements, each safe to run again:
-- 1. the new defaults, so that the rows written from here on carry them
--    (catalog only: INSTANT on MySQL 8 and MariaDB);
-- 2. the rows there give their NULLs up, at READ COMMITTED, so that the
--    UPDATE locks the rows it changes and no gap: writers' inserts go on
--    (relays skip the locked rows until it commits);
-- 3. NOT NULL, and lease_owner dropped and added again as CHAR(80) (changing
--    VARCHAR to CHAR in place is a copy of the table that writers wait for;
--    dropping and adding a column is INSTANT on MariaDB 10.4+ and MySQL
--    8.0.29+). NOT NULL rebuilds the table in place, with writers going on
--    (LOCK = NONE: the server refuses the step rather than make them wait).
--    The owners of the leases held at that moment are gone (the leases
--    stay: it is only who holds them, for operators).
-- Stop relays older than this migration first: they write NULL to these
-- columns, which step 3 refuses while it runs, and they could not run after
-- it (a NULL is refused by the column).
ALTER TABLE {table}
    ALTER COLUMN claim_token SET DEFAULT '',
    ALTER COLUMN lease_expires_at SET DEFAULT '1000-01-01 00:00:00';
SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;
UPDATE {table}
SET claim_token = COALESCE(claim_token, ''), lease_expires_at = COALESCE(lease_expires_at, '1000-01-01 00:00:00')
WHERE claim_token IS NULL OR lease_expires_at IS NULL;
ALTER TABLE {table}
    MODIFY COLUMN claim_token CHAR(36) CHARACTER SET ascii NOT NULL DEFAULT '',
    MODIFY COLUMN lease_expires_at DATETIME(6) NOT NULL DEFAULT '1000-01-01 00:00:00',
    DROP COLUMN lease_owner,
    ADD COLUMN lease_owner CHAR(80) CHARACTER SET utf8mb4 NOT NULL DEFAULT '' AFTER last_error,
    LOCK = NONE;
