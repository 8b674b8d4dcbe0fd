-- publish() asks this when the idempotency key it was given is taken already,
-- as on PostgreSQL (relay/store/migrations/0005_writer_bounds.sql): whether the
-- event there has the topic and key it wrote (NULL when it is gone). Another
-- writer of the table may have taken the key first, and the caller's event
-- would be lost without a word. SQL SECURITY DEFINER: writers may not read
-- others' topics and keys; they learn only whether theirs match. The payload
-- is not compared: a retry may well carry a recomputed one.
--
-- As the trigger of 0005: creating a function asks for CREATE ROUTINE, and with
-- binary logging on for SUPER or log_bin_trust_function_creators = 1.
CREATE FUNCTION {same_event_func}(
    given_idempotency_key VARBINARY(801), given_topic VARBINARY(1000), given_key VARBINARY(1025)
) RETURNS BOOLEAN READS SQL DATA SQL SECURITY DEFINER
    RETURN (SELECT CAST(topic AS BINARY) = given_topic AND `key` <=> given_key FROM {table}
            WHERE idempotency_key = given_idempotency_key);
