-- Bytes payloads, as on PostgreSQL (relay/store/migrations/0004): an event's
-- body is either JSON (payload) or bytes with their content type
-- (payload_bytes, content_type), never both, never neither.
--
-- One ALTER TABLE, so that the step is applied whole or not at all (MySQL
-- commits each DDL statement on its own). Adding a CHECK, and on MySQL 8
-- making a column nullable, rebuild the table: on a big outbox that is a copy
-- of it, during which writers wait (docs/mysql.md, "Bytes payloads").
-- content_type is text (utf8mb4) of 1 to 255 bytes, counted with OCTET_LENGTH:
-- RabbitMQ carries it as a short string. Not `content_type <> ''`: under a
-- PAD SPACE collation ' ' equals '' and would be refused, as it is not on
-- PostgreSQL. A NULL content type makes the last test NULL, which a CHECK lets
-- through; the second test then requires payload_bytes NULL too.
ALTER TABLE {table}
    MODIFY COLUMN payload JSON NULL,
    ADD COLUMN payload_bytes LONGBLOB NULL,
    ADD COLUMN content_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD CONSTRAINT {payload_check} CHECK (
        (payload IS NULL) <> (payload_bytes IS NULL)
        AND (content_type IS NULL) = (payload_bytes IS NULL)
        AND OCTET_LENGTH(content_type) BETWEEN 1 AND 255
    );
