-- The length limits as CHECKs, so that a writer whose sql_mode is not strict
-- (`SET SESSION sql_mode = ''`, older applications' default) is refused as a
-- strict one is. Without strict mode the server cuts an over-long value to the
-- column's size with only a warning: two long keys became one (their orders
-- mixed), a long topic another topic, and two long idempotency keys one, whose
-- error 1062 reads as "already written", so that a distinct event was lost.
-- Each column is one unit wider than its limit and a CHECK holds the limit: a
-- cut value keeps one unit too many, and the CHECK refuses it in every
-- sql_mode (MariaDB error 4025, MySQL 8.0.16+ error 3819). topic counts
-- characters (its Kafka limit, and PostgreSQL's check); `key` and
-- idempotency_key bytes; content_type bytes already (0002), with room for
-- one character more. The indexes stay far below InnoDB's 3,072 bytes
-- (`key`, state, id: 1,041).
--
-- One ALTER TABLE, applied whole or not at all: a column widened without its
-- CHECK would take the cut values. Adding a CHECK copies the table on both
-- servers (ALGORITHM=COPY): reads go on, writers and relays wait until it
-- ends (docs/mysql.md, "Writers without strict mode"). Every existing row is
-- within the limits, so the copy cannot fail on one.
ALTER TABLE {table}
    MODIFY COLUMN topic VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    MODIFY COLUMN `key` VARBINARY(1025),
    MODIFY COLUMN idempotency_key VARBINARY(801) NOT NULL DEFAULT (UUID()),
    MODIFY COLUMN content_type VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    DROP CONSTRAINT {topic_check},
    ADD CONSTRAINT {topic_check} CHECK (OCTET_LENGTH(topic) > 0 AND CHAR_LENGTH(topic) <= 249),
    DROP CONSTRAINT {idempotency_key_check},
    ADD CONSTRAINT {idempotency_key_check} CHECK (idempotency_key <> '' AND OCTET_LENGTH(idempotency_key) <= 800),
    ADD CONSTRAINT {key_check} CHECK (OCTET_LENGTH(`key`) <= 1024);
