-- The outbox table on MySQL 8 and MariaDB 10.11 (InnoDB), in the dialect both
-- servers speak. Placeholders in braces are identifiers quoted with backticks
-- by relay.store.mysql.sql, from a validated table name, never from values.
-- Statements are separated by a semicolon at the end of a line.
--
-- Timestamps are DATETIME(6) in UTC: defaults use UTC_TIMESTAMP(6), so what a
-- writer's session time zone says does not matter.
-- `key` and idempotency_key are VARBINARY: compared byte for byte, as on
-- PostgreSQL (a _ci collation would merge 'A' and 'a', a PAD SPACE one 'k' and
-- 'k '). The relay reads them back as UTF-8. `key` is a reserved word: quote it.
CREATE TABLE {table} (
    id               BIGINT       NOT NULL AUTO_INCREMENT,
    topic            VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`            VARBINARY(1024),
    payload          JSON         NOT NULL,
    headers          JSON         NOT NULL DEFAULT ('{{}}'),
    idempotency_key  VARBINARY(800) NOT NULL DEFAULT (UUID()),
    deliver_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    priority         INT          NOT NULL DEFAULT 0,
    -- Relay-owned columns. "In flight" is state = 'pending' with a live lease.
    state            VARCHAR(8)   CHARACTER SET ascii NOT NULL DEFAULT 'pending',
    attempts         INT          NOT NULL DEFAULT 0,
    last_error       TEXT         CHARACTER SET utf8mb4,
    lease_owner      VARCHAR(255) CHARACTER SET utf8mb4,
    claim_token      CHAR(36)     CHARACTER SET ascii,
    lease_expires_at DATETIME(6),
    created_at       DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    published_at     DATETIME(6),
    failed_at        DATETIME(6),
    PRIMARY KEY (id),
    CONSTRAINT {topic_check} CHECK (topic <> ''),
    CONSTRAINT {idempotency_key_check} CHECK (idempotency_key <> ''),
    CONSTRAINT {headers_check} CHECK (JSON_TYPE(headers) = 'OBJECT'),
    CONSTRAINT {state_check} CHECK (state IN ('pending', 'sent', 'failed', 'skipped')),
    CONSTRAINT {idempotency_key_unique} UNIQUE (idempotency_key),
    -- Claim order among due events (priority first, highest first, then id).
    INDEX {claim_idx} (state, priority DESC, id),
    -- Per-key ordering: "is there an earlier unsent event of this key?", and dead letters by key.
    INDEX {key_idx} (`key`, state, id),
    -- Dead letters and the keys they park, for status and the gauges.
    INDEX {failed_idx} (state, `key`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
