-- The Debezium layout's SQL beside its numbered migrations. "-- name: X" starts piece X.

-- name: create_table
-- Debezium's default outbox table, for a table that does not exist yet.
CREATE TABLE IF NOT EXISTS {table} (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb
);

-- name: view
-- The table as the relay's queries (queries.sql) see a native outbox table:
-- the same column names, each a plain column of the table where the queries
-- filter, index or update, so that the planner uses the indexes of
-- 1001_relay_columns.sql and the view stays updatable. The topic follows the
-- session's outbox_relay.topic_template, which the relay sets from
-- --topic-template; a null aggregatetype gives an empty topic, never a null one
-- (the claim compares topics, and a null would stall its key; the sinks
-- dead-letter an empty topic). headers holds the event id and the application's other
-- columns as text, but only in sessions that set outbox_relay.columns_in_headers
-- (a relay with --field-header, and the admin commands): building them costs a
-- relay without one a tenth of its claim. The store sends the id (the
-- idempotency key) and the --field-header columns.
-- {payload} is the payload's columns for the payload column's type.
CREATE OR REPLACE VIEW {view} AS
SELECT o.relay_seq AS id,
       coalesce(replace(coalesce(nullif(current_setting('outbox_relay.topic_template', true), ''), {default_template}),
                        '{{aggregatetype}}', o.aggregatetype), '') AS topic,
       o.aggregateid::text AS key,
       {payload},
       CASE WHEN current_setting('outbox_relay.columns_in_headers', true) = 'on'
            THEN jsonb_build_object('id', o.id::text{fields}) END AS headers,
       o.id::text AS idempotency_key,
       o.relay_deliver_at AS deliver_at,
       o.relay_priority AS priority,
       o.relay_state AS state,
       o.relay_attempts AS attempts,
       o.relay_last_error AS last_error,
       o.relay_lease_owner AS lease_owner,
       o.relay_claim_token AS claim_token,
       o.relay_lease_expires_at AS lease_expires_at,
       o.relay_created_at AS created_at,
       o.relay_published_at AS published_at,
       o.relay_failed_at AS failed_at
FROM {table} AS o;
