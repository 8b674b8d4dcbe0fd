-- Bytes payloads: an event's body is either JSON (payload) or bytes with their
-- content type (payload_bytes, content_type), never both, never neither.
--
-- Cheap on a big table: dropping NOT NULL and adding nullable columns with no
-- default change only the catalog. The CHECK is added NOT VALID (a moment's
-- lock; new rows are checked from then on), then validated, which reads the
-- table once under a lock that lets inserts, updates and claims go on.
-- content_type is at most 255 bytes: RabbitMQ carries it as a short string.

ALTER TABLE {table} ALTER COLUMN payload DROP NOT NULL;

ALTER TABLE {table} ADD COLUMN payload_bytes bytea;

ALTER TABLE {table} ADD COLUMN content_type text;

ALTER TABLE {table} ADD CONSTRAINT {payload_check} CHECK (
    (payload IS NULL) <> (payload_bytes IS NULL)
    AND (content_type IS NULL) = (payload_bytes IS NULL)
    AND content_type <> '' AND octet_length(content_type) <= 255
) NOT VALID;

ALTER TABLE {table} VALIDATE CONSTRAINT {payload_check};
