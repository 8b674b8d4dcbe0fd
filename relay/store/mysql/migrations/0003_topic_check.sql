-- A topic of spaces, as on PostgreSQL: `topic <> ''` under the PAD SPACE
-- collation took ' ' for '' and refused it (the trap 0002 avoids for
-- content_type). OCTET_LENGTH counts what is there. One ALTER TABLE, applied
-- whole or not at all; changing a CHECK rebuilds the table, during which
-- writers wait (docs/mysql.md).
ALTER TABLE {table}
    DROP CONSTRAINT {topic_check},
    ADD CONSTRAINT {topic_check} CHECK (OCTET_LENGTH(topic) > 0);
