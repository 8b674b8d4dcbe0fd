-- The full current schema of an outbox table on MySQL 8 / MariaDB 10.11,
-- equivalent to applying every migration in migrations/ in order (a test
-- checks that they agree). outbox-relay migrate applies the migrations; this
-- file is for reading and for tools that want the whole schema at once.

CREATE TABLE IF NOT EXISTS {version_table} (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(200) NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB;

CREATE TABLE {table} (
    id               BIGINT       NOT NULL AUTO_INCREMENT,
    -- One unit wider than the CHECKs below allow: a value cut to the column's size by a
    -- writer without strict mode is still too long, and refused (migration 0004).
    topic            VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`            VARBINARY(1025),
    -- The JSON body; NULL for a bytes event.
    payload          JSON,
    headers          JSON         NOT NULL DEFAULT ('{{}}'),
    idempotency_key  VARBINARY(801) NOT NULL DEFAULT (UUID()),
    deliver_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    priority         INT          NOT NULL DEFAULT 0,
    -- Relay-owned columns. "In flight" is state = 'pending' with a live lease.
    state            VARCHAR(8)   CHARACTER SET ascii NOT NULL DEFAULT 'pending',
    attempts         INT          NOT NULL DEFAULT 0,
    last_error       TEXT         CHARACTER SET utf8mb4,
    -- Never NULL, and of one width leased or not (migration 0007): no lease is '', '' and
    -- '1000-01-01 00:00:00', and the lease UPDATE overwrites the row in place.
    lease_owner      CHAR(80)     CHARACTER SET utf8mb4 NOT NULL DEFAULT '',
    claim_token      CHAR(36)     CHARACTER SET ascii NOT NULL DEFAULT '',
    lease_expires_at DATETIME(6)  NOT NULL DEFAULT '1000-01-01 00:00:00',
    created_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    published_at     DATETIME(6),
    failed_at        DATETIME(6),
    -- A bytes payload and its content type; payload is then NULL.
    payload_bytes    LONGBLOB,
    content_type     VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    PRIMARY KEY (id),
    CONSTRAINT {topic_check} CHECK (OCTET_LENGTH(topic) > 0 AND CHAR_LENGTH(topic) <= 249),
    CONSTRAINT {key_check} CHECK (OCTET_LENGTH(`key`) <= 1024),
    CONSTRAINT {idempotency_key_check} CHECK (idempotency_key <> '' AND OCTET_LENGTH(idempotency_key) <= 800),
    CONSTRAINT {headers_check} CHECK (JSON_TYPE(headers) = 'OBJECT'),
    CONSTRAINT {state_check} CHECK (state IN ('pending', 'sent', 'failed', 'skipped')),
    CONSTRAINT {idempotency_key_unique} UNIQUE (idempotency_key),
    -- Exactly one payload form: JSON, or bytes with their content type (1 to 255 bytes).
    CONSTRAINT {payload_check} CHECK (
        (payload IS NULL) <> (payload_bytes IS NULL)
        AND (content_type IS NULL) = (payload_bytes IS NULL)
        AND OCTET_LENGTH(content_type) BETWEEN 1 AND 255
    ),
    INDEX {claim_idx} (state, priority DESC, id),
    INDEX {key_idx} (`key`, state, id),
    INDEX {failed_idx} (state, `key`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- What a writer may put in the columns that order delivery, judged as it is
-- written (migrations/0005_writer_bounds.sql says why a trigger, not a CHECK).
CREATE TRIGGER {writer_bounds_trigger} BEFORE INSERT ON {table} FOR EACH ROW
    -- (One statement, its semicolons inside lines: the script's statements end at a line's end.)
    IF NEW.priority NOT BETWEEN -1000 AND 1000 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'priority is out of range: from -1000 to 1000'; ELSEIF
        NEW.deliver_at > UTC_TIMESTAMP(6) + INTERVAL 366 DAY THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'deliver_at is more than 366 days from now'; END IF;

-- publish()'s question when its idempotency key is taken (migrations/0006_same_event.sql).
CREATE FUNCTION {same_event_func}(given_idempotency_key VARBINARY(801), given_topic VARBINARY(1000))
    RETURNS BOOLEAN READS SQL DATA SQL SECURITY DEFINER
    RETURN (SELECT CAST(topic AS BINARY) = given_topic FROM {table} WHERE idempotency_key = given_idempotency_key);

INSERT INTO {version_table} (version, name) VALUES (1, 'initial'), (2, 'bytes_payloads'), (3, 'topic_check'), (4, 'length_checks'),
    (5, 'writer_bounds'), (6, 'same_event'), (7, 'fixed_width_lease');
