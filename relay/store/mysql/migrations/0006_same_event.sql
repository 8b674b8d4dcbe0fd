-- publish() asks this when the idempotency key it was given is taken already,
-- as on PostgreSQL (relay/store/migrations/0005_writer_bounds.sql): whether the
-- event there has the topic it wrote (NULL when it is gone). Another writer of
-- the table may have taken the key first, and the caller's event would be lost
-- without a word. SQL SECURITY DEFINER: writers may not read others' topics;
-- they learn only whether theirs matches. Only the topic: a retry may well
-- carry a recomputed payload, or leave out its key.
--
-- As the trigger of 0005: creating a function asks for CREATE ROUTINE, and with
-- binary logging on for SUPER or log_bin_trust_function_creators = 1.
CREATE FUNCTION {same_event_func}(given_idempotency_key VARBINARY(801), given_topic VARBINARY(1000))
    RETURNS BOOLEAN READS SQL DATA SQL SECURITY DEFINER
    RETURN (SELECT CAST(topic AS BINARY) = given_topic FROM {table} WHERE idempotency_key = given_idempotency_key);
