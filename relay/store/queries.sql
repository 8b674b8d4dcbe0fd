-- Named queries of the PostgreSQL store. "-- name: X" starts query X.
-- {table} and friends are identifiers filled in by psycopg.sql; %(x)s are
-- parameters sent separately.

-- name: claim
-- Lease a batch of due events: runs of each key's oldest unsent events, in id
-- order and to one topic, and any number without a key. The argument is in
-- docs/ordering.md; in short:
-- * candidates: the first %(limit)s pending, due, unleased (or expired, with
--   attempts left) rows in (priority, id) order, skipping rows another claim
--   has locked. A row goes in only if the oldest unsent event of its key (its
--   "first", one index probe) is itself, in flight, or could be claimed now
--   and comes before it in that order: a key parked behind a dead letter or a
--   retry, or whose oldest event has a lower priority, takes no place in the
--   batch. A row of a key in flight does take a place (and goes nowhere unless
--   the flight is this relay's): the scan stays bounded by %(limit)s. A key
--   this relay has in flight (%(tail_keys)s) skips the probe: its run can only
--   go on after its tail (heads), or not at all, whatever its first is; if its
--   first is a retry or a dead letter, the sink holds the key (relay/holds.py).
-- * heads: where a key's run starts. A key this relay has in flight goes on
--   after its last event in flight (tails, in batches %(mine)s whose leases
--   still hold), to the same topic only; any other key starts at its first,
--   which must be a candidate.
-- * A run takes the key's candidates from its head on, up to the first unsent
--   event of the key that is not a candidate or goes to another topic (one
--   index walk for a key in flight or with several candidates, from just
--   after the tail or from the first; none for any other key with one). The
--   walk reads ids only, from the key index, and takes each one's topic from
--   the candidates: a row that is no candidate ends the run either way.
-- attempts counts claims, so a lease that expires because its relay died
-- still counts as an attempt.
-- The batch stops adding events once their payloads and headers reach
-- %(max_bytes)s bytes (the first event always goes in), each counted at its
-- size uncompressed: the size it takes in the table unless it is compressed
-- there (#> '{{}}' is then the value itself, decompressed); a bytes payload at
-- its length (octet_length reads it from the value's header, without
-- decompressing). Headers that are '{{}}' (or NULL, as a Debezium view may
-- give them) count nothing: no jsonb but '{{}}' and '[]' is as small as 8
-- bytes (5 in a row), and pg_column_size reads that from the value's header,
-- so an event without headers counts only its payload, at no cost to speak of.
-- A key's run is cut, never holed: an event counts from the place of the
-- latest of its run's earlier events.
-- The running sum, and the sort it needs, run only when the candidates reach
-- the cap at all.
-- The last two columns, the same in every row, are the xmin of the claim's
-- snapshot and its own transaction id, for the keyset hint (relay/store/floor.py).
-- The store reads every column by name. created_at is clamped to the years a
-- Python datetime holds, in any session time zone (hence a day inside each
-- end): plain SQL may write 'infinity' or year 20000, and a row no claim could
-- load would stall every claim.
-- A hinted claim runs this as claim_hinted (relay/store/sql.py), which enters
-- the claim index at (priority, after) for each priority seen so far.
WITH candidates AS (
    SELECT o.id, o.key, o.topic, o.priority, o.lease_expires_at AS old_lease, first.id AS first_id,
           CASE WHEN o.payload IS NULL THEN octet_length(o.payload_bytes)
                WHEN pg_column_compression(o.payload) IS NULL THEN pg_column_size(o.payload)
                ELSE pg_column_size(o.payload #> '{{}}') END
           + CASE WHEN o.headers IS NULL OR pg_column_size(o.headers) <= 8 THEN 0  -- none, or '{{}}'
                  WHEN pg_column_compression(o.headers) IS NULL THEN pg_column_size(o.headers)
                  ELSE pg_column_size(o.headers #> '{{}}') END AS bytes
    FROM {table} AS o
    LEFT JOIN LATERAL (
        SELECT f.id, f.priority, f.deliver_at, f.lease_expires_at, f.claim_token, f.attempts,
               f.state = 'pending' AS pending
        FROM {table} AS f
        WHERE f.key = o.key AND f.state IN ('pending', 'failed')
          AND (o.key IN (SELECT unnest(%(tail_keys)s::text[]))) IS NOT TRUE
        ORDER BY f.id
        LIMIT 1) AS first ON o.key IS NOT NULL
    WHERE o.state = 'pending'
      AND o.id >= %(after)s  -- the keyset hint (relay/store/floor.py); the least bigint for a full scan
      AND o.deliver_at <= now()
      AND (o.lease_expires_at IS NULL OR o.claim_token IS NULL  -- never leased, or settled (see retry)
           OR (o.lease_expires_at < now() AND o.attempts < %(max_attempts)s))
      AND (o.key IS NULL OR first.id IS NULL OR first.id >= o.id
           OR (first.pending AND first.lease_expires_at >= now())  -- in flight
           OR (first.pending AND first.priority >= o.priority AND first.deliver_at <= now()
               AND (first.lease_expires_at IS NULL OR first.claim_token IS NULL
                    OR first.attempts < %(max_attempts)s)))
    ORDER BY o.priority DESC, o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), keyed AS (
    SELECT c.key, count(*) AS n, min(c.first_id) AS first_id,
           min(c.topic) FILTER (WHERE c.id = c.first_id) AS first_topic
    FROM candidates AS c
    WHERE c.key IS NOT NULL
    GROUP BY c.key
), heads AS MATERIALIZED (
    -- Where each key's run starts. A key this relay has in flight goes on
    -- right after its last event in flight (its tail), to the tail's topic, if
    -- the tail's lease still holds; any other key starts at its first event.
    -- %(tail_keys)s, %(tail_ids)s, %(tail_topics)s: the relay's tails, key by key.
    -- (A tail at the largest bigint has nothing after it, and t.id + 1 would overflow.)
    SELECT k.key, k.n,
           coalesce(CASE WHEN t.id < 9223372036854775807 THEN t.id + 1 ELSE t.id END, k.first_id) AS start,
           coalesce(t.topic, k.first_topic) AS topic,
           t.id IS NOT NULL AS flying
    FROM keyed AS k
    LEFT JOIN unnest(%(tail_keys)s::text[], %(tail_ids)s::bigint[], %(tail_topics)s::text[]) AS t(key, id, topic)
        ON t.key = k.key
    -- One primary-key probe per tail. OFFSET 0 keeps it one: with thousands of
    -- tails the planner chose to hash the EXISTS over a scan of the whole table.
    WHERE t.id IS NULL
       OR EXISTS (SELECT 1 FROM {table} AS tail
                  WHERE tail.id = t.id AND tail.state = 'pending'
                    AND tail.claim_token = ANY(%(mine)s::uuid[]) AND tail.lease_expires_at > now()
                  OFFSET 0)
), members AS MATERIALIZED (
    -- The events of the runs, and whether each is chained. A run takes the
    -- key's unsent events from its start on while each is a candidate going to
    -- the run's topic: one index walk, of at most the key's candidates, for a
    -- key in flight or with several candidates; none for a key with one that
    -- is not in flight (its run is its first event, if that is a candidate).
    -- A run whose topic is unknown (NULL: its first is no candidate, being in
    -- flight, another relay's or one this relay did not name, or locked by
    -- another claim) cannot start, and is not walked: each of its rows would
    -- be compared with every candidate in turn (a row holding a NULL finds no
    -- hashed match), 350 ms a claim where another relay holds 1,000 keys' heads.
    SELECT h.start AS id, false AS chained
    FROM heads AS h
    -- (IS TRUE keeps this a hashed lookup, not a join planned as a loop)
    WHERE h.n = 1 AND NOT h.flying AND (h.start IN (SELECT c.id FROM candidates AS c)) IS TRUE
    UNION ALL
    SELECT w.id, h.flying OR w.id > h.start
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT e.id,
               bool_and(((e.id, h.topic) IN (SELECT c.id, c.topic FROM candidates AS c)) IS TRUE)
                   OVER (ORDER BY e.id ROWS UNBOUNDED PRECEDING) AS unbroken
        FROM {table} AS e
        WHERE e.key = h.key AND e.id >= h.start AND e.state IN ('pending', 'failed')
        ORDER BY e.id
        LIMIT h.n) AS w
    WHERE (h.n > 1 OR h.flying) AND h.topic IS NOT NULL AND w.unbroken
), placed AS (
    -- Membership through hashed lookups: a join here is planned as a loop over the runs for each candidate.
    SELECT c.id, c.key, c.old_lease, c.bytes,
           c.id IN (SELECT m.id FROM members AS m WHERE m.chained) AS chained,
           row_number() OVER (ORDER BY c.priority DESC, c.id) AS place
    FROM candidates AS c
    WHERE c.key IS NULL OR c.id IN (SELECT m.id FROM members AS m)
), total AS (
    SELECT coalesce(sum(bytes), 0) AS bytes FROM placed
), chosen AS (
    -- Under the cap, all of them, without the running sum (its sort) ...
    SELECT p.id, p.old_lease, p.chained
    FROM placed AS p
    WHERE (SELECT bytes FROM total) < %(max_bytes)s
    UNION ALL
    -- ... or those that came while the sum was under the cap.
    SELECT s.id, s.old_lease, s.chained
    FROM (SELECT q.*, sum(q.bytes) OVER (ORDER BY q.at, q.id ROWS UNBOUNDED PRECEDING) - q.bytes AS before
          FROM (SELECT p.*, CASE WHEN p.key IS NULL THEN p.place
                                 ELSE max(p.place) OVER (PARTITION BY p.key ORDER BY p.id) END AS at
                FROM placed AS p) AS q) AS s
    WHERE (SELECT bytes FROM total) >= %(max_bytes)s AND s.before < %(max_bytes)s
)
UPDATE {table} AS o
SET claim_token = %(token)s,
    lease_owner = %(owner)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    -- One more, counting from 0 at least and never past the int column (relay/store/base.py, next_attempt).
    attempts = least(greatest(o.attempts, 0), 2147483646) + 1
FROM chosen AS c
WHERE o.id = c.id
RETURNING o.id, o.topic, o.key, o.payload::text AS payload, o.payload_bytes, o.content_type,
          nullif(o.headers, '{{}}'::jsonb)::text AS headers, o.idempotency_key,
          o.attempts, least(greatest(o.created_at, '0001-01-02 00:00:00+00'::timestamptz),
                            '9999-12-30 00:00:00+00'::timestamptz) AS created_at,
          o.priority, c.old_lease IS NOT NULL AS reaped, c.chained,
          (SELECT pg_snapshot_xmin(pg_current_snapshot()))::text::bigint AS snapshot_xmin,
          (SELECT pg_current_xact_id())::text::bigint AS xact_id;

-- name: reap_exhausted
-- Dead-letter events whose lease expired with no attempts left: the relays
-- holding them died or stalled every time, so another try would loop. The
-- lease's end stays: a stalled relay may still be publishing the event, and
-- skip refuses it until the end is past its grace (see skip). An event whose
-- lease ended by a settle (retry, release: no token, see retry) is held by no
-- relay: not one of these, whatever its attempts (a relay allowing more retried it).
UPDATE {table}
SET state = 'failed', failed_at = now(), claim_token = NULL,
    last_error = 'lease expired on attempt ' || attempts || ': the relay holding it crashed or stalled'
WHERE state = 'pending'
  AND claim_token IS NOT NULL
  AND lease_expires_at < now()
  AND attempts >= %(max_attempts)s
RETURNING id;

-- name: ack_delete
DELETE FROM {table}
WHERE id = ANY(%(ids)s::bigint[]) AND claim_token = %(token)s;

-- name: ack_keep
UPDATE {table}
SET state = 'sent', published_at = now(), lease_expires_at = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND claim_token = %(token)s;

-- name: retry
-- A settle ends the lease (NULL), but for an event the claim took over from
-- a lease that had ended (%(taken_over)s): its end is now, so that skip waits
-- out its grace for the relay that held it, which may still be publishing it.
-- So do dead_letter and release.
UPDATE {table} AS o
SET lease_expires_at = CASE WHEN o.id = ANY(%(taken_over)s::bigint[]) THEN now() END,
    claim_token = NULL, lease_owner = NULL,
    deliver_at = now() + make_interval(secs => r.delay), last_error = r.error
FROM unnest(%(ids)s::bigint[], %(delays)s::float8[], %(errors)s::text[]) AS r(id, delay, error)
WHERE o.id = r.id AND o.claim_token = %(token)s;

-- name: dead_letter
UPDATE {table} AS o
SET state = 'failed', failed_at = now(),
    lease_expires_at = CASE WHEN o.id = ANY(%(taken_over)s::bigint[]) THEN now() END, claim_token = NULL,
    last_error = r.error
FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS r(id, error)
WHERE o.id = r.id AND o.claim_token = %(token)s;

-- name: renew
-- Start a batch's lease again, for the events it still holds: a batch that
-- waited past the point where its lease could end before its publish and
-- settle were done (a payload that takes seconds to read, a stalled process).
-- Only while the lease holds: once it ended, another relay may have taken or
-- dead-lettered other events of the batch's keys (reap_exhausted), so a row
-- still under this token is no longer known to be next of its key.
UPDATE {table}
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
WHERE id = ANY(%(ids)s::bigint[]) AND claim_token = %(token)s AND state = 'pending'
  AND lease_expires_at >= now()
RETURNING id;

-- name: release
-- Give back events that were claimed but not published (graceful stop, broker
-- down): the claim does not count as an attempt. A positive delay (the broker
-- of their route is down) makes them due again only then, so relays do not
-- claim and release them in a loop; they still block later events of their key.
UPDATE {table}
SET lease_expires_at = CASE WHEN id = ANY(%(taken_over)s::bigint[]) THEN now() END,
    claim_token = NULL, lease_owner = NULL,
    attempts = greatest(attempts - 1, 0),
    deliver_at = CASE WHEN %(delay)s::float8 > 0
                      THEN now() + make_interval(secs => %(delay)s::float8)
                      ELSE deliver_at END
WHERE id = ANY(%(ids)s::bigint[]) AND claim_token = %(token)s;

-- name: status
-- Counts are exact: one pass over the unsent rows, which costs about as much
-- as a sequential scan of the table (see gauges for the relays' cheap form).
-- The age is cheap whatever the table holds (see oldest_pending_age).
-- scheduled counts the pending events not due yet.
WITH counts AS (
    SELECT
        count(*) FILTER (WHERE o.state = 'pending' AND NOT coalesce(o.lease_expires_at >= now(), false)) AS pending,
        count(*) FILTER (WHERE o.state = 'pending' AND o.lease_expires_at >= now()) AS in_flight,
        count(*) FILTER (WHERE o.state = 'failed') AS failed,
        count(DISTINCT o.key) FILTER (WHERE o.state = 'failed') AS parked_keys,
        count(*) FILTER (WHERE o.state = 'pending' AND o.deliver_at > now()
                           AND NOT coalesce(o.lease_expires_at >= now(), false)) AS scheduled,
        array_agg(DISTINCT o.key) FILTER (WHERE o.state = 'pending' AND o.deliver_at > now()
                                            AND o.key IS NOT NULL) AS scheduled_keys,
        count(*) FILTER (WHERE /* include retrying */) AS retrying,
        -- Clamped as in oldest_pending_age.
        min(least(greatest(o.created_at, '0001-01-02 00:00:00+00'::timestamptz), now()))
            FILTER (WHERE /* include retrying */) AS oldest_retrying
    FROM {table} AS o
    WHERE o.state IN ('pending', 'failed')
)
SELECT c.pending, c.in_flight, c.failed, c.parked_keys, c.scheduled, c.retrying,
       coalesce(extract(epoch FROM now() - c.oldest_retrying), 0)::float8 AS oldest_retrying_age_seconds,
       /* include keys_waiting_on_schedule */ AS keys_waiting_on_schedule
FROM counts AS c;

-- name: oldest_pending_age
-- The age of the oldest event status counts as pending: due, and not leased.
-- A loose index scan over the claim index: each distinct priority, then the
-- lowest due ids of each that no live lease holds (ids follow insertion, so
-- those are the oldest up to transactions still open when they inserted): a
-- handful of index probes, plus a step over each event in flight. The first
-- hundred of each, not the first alone: created_at is the writer's to set,
-- and one written ahead of the clock (a local time taken for UTC) would
-- otherwise hide the age of every event after it.
WITH RECURSIVE priorities AS (
    (SELECT priority FROM {table} WHERE state = 'pending' ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT o.priority FROM {table} AS o
             WHERE o.state = 'pending' AND o.priority < p.priority
             ORDER BY o.priority DESC LIMIT 1)
    FROM priorities AS p
    WHERE p.priority IS NOT NULL
)
-- (Never below 0: created_at is the writer's to set, and may lie ahead of the clock, or be
-- 'infinity' or '-infinity', which no subtraction takes: clamped to now and to year 1.)
-- (Clamped row by row: greatest() skips a NULL, and min() of no row is one.)
SELECT coalesce(extract(epoch FROM now() - min(least(greatest(h.created_at, '0001-01-02 00:00:00+00'::timestamptz),
                                                     now()))), 0)::float8 AS age
FROM priorities AS p
CROSS JOIN LATERAL (
    SELECT o.created_at FROM {table} AS o
    WHERE o.state = 'pending' AND o.priority = p.priority AND o.deliver_at <= now()
      AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
    ORDER BY o.priority DESC, o.id
    LIMIT 100
) AS h
WHERE p.priority IS NOT NULL;

-- name: gauges
-- The status figures for the relays' gauges, at a bounded cost whatever the
-- table holds. It reads the first %(exact_up_to)s + 1 unsent events in claim
-- order (the claim index, and the heap for each lease): when that is all of
-- them, pending, in_flight and scheduled are exact, as in status. Past that
-- the caller takes unsent_estimate instead: the table's live-row counter,
-- which the statistics system keeps as rows are inserted and deleted, times
-- the share of unsent rows at the last ANALYZE; in_flight and scheduled then
-- count what the events read hold, at the front of the order, where claims
-- take them. keys_waiting_on_schedule probes the key index as status does,
-- for at most 1,000 of the keys with a scheduled event among them.
-- Dead letters have their own small index: always exact.
WITH head AS (
    SELECT o.key, o.lease_expires_at >= now() AS leased,
           o.deliver_at > now() AND NOT coalesce(o.lease_expires_at >= now(), false) AS scheduled
    FROM {table} AS o
    WHERE o.state = 'pending'
    ORDER BY o.priority DESC, o.id
    LIMIT %(exact_up_to)s::bigint + 1
), h AS (
    SELECT count(*) AS unsent, count(*) FILTER (WHERE leased) AS in_flight, count(*) FILTER (WHERE scheduled) AS scheduled,
           (array_agg(DISTINCT key) FILTER (WHERE scheduled AND key IS NOT NULL))[:1000] AS scheduled_keys
    FROM head
)
SELECT h.unsent, h.in_flight, h.scheduled, f.failed, f.parked_keys,
       round(s.live_rows * s.unsent_share)::bigint AS unsent_estimate,
       -- As in status, for at most 1,000 keys (see h): a lower bound past that.
       /* include keys_waiting_on_schedule */ AS keys_waiting_on_schedule
FROM h
CROSS JOIN (
    SELECT count(*) AS failed, count(DISTINCT key) AS parked_keys
    FROM {table}
    WHERE state = 'failed'
) AS f
CROSS JOIN (
    -- The counter is 0 after a statistics reset: the row count of the last
    -- VACUUM or ANALYZE stands in. No statistics yet: every row is unsent.
    SELECT CASE WHEN pg_stat_get_live_tuples(c.oid) > 0
                THEN pg_stat_get_live_tuples(c.oid) ELSE greatest(c.reltuples, 0) END AS live_rows,
           coalesce((SELECT coalesce(st.most_common_freqs[array_position(st.most_common_vals::text::text[], 'pending')], 0)
                     FROM pg_stats AS st
                     WHERE st.schemaname = n.nspname AND st.tablename = c.relname
                       AND st.attname = %(state_column)s AND NOT st.inherited), 1) AS unsent_share
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = %(table_name)s::regclass
) AS s;

-- name: dead
SELECT o.id, o.topic, o.key, o.idempotency_key, o.attempts, o.last_error,
       o.created_at, o.failed_at,
       (SELECT count(*) FROM {table} AS later
         WHERE o.key IS NOT NULL AND later.key = o.key AND later.id > o.id
           AND later.state = 'pending') AS blocked_events
FROM {table} AS o
WHERE o.state = 'failed'
  AND (%(topic)s::text IS NULL OR o.topic = %(topic)s::text)
ORDER BY o.id
LIMIT %(limit)s;

-- name: requeue_select
-- The next batch of dead letters a requeue takes: at most %(limit)s, in id
-- order after %(after)s (relay/store/batches.py). Every dead letter only with
-- %(all)s: an empty filter matches nothing.
SELECT id FROM {table}
WHERE state = 'failed'
  AND (%(after)s::bigint IS NULL OR id > %(after)s::bigint)
  AND (%(all)s OR num_nonnulls(%(id)s::bigint, %(topic)s::text, %(key)s::text) > 0)
  AND (%(id)s::bigint IS NULL OR id = %(id)s::bigint)
  AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
ORDER BY id
LIMIT %(limit)s;

-- name: requeue
-- One batch from requeue_select; a row another operator changed meanwhile is no longer failed.
UPDATE {table}
SET state = 'pending', attempts = 0, failed_at = NULL, deliver_at = now(),
    lease_expires_at = NULL, claim_token = NULL, lease_owner = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'failed'
RETURNING id;

-- name: retry_now
-- Make retrying events due now: a failing event whose cause was fixed (a
-- queue bound, a topic created) need not wait out its backoff. Attempts stay
-- as they are. An event in flight is not touched: a relay is trying it.
UPDATE {table} AS o
SET deliver_at = now()
WHERE o.state = 'pending' AND o.attempts > 0 AND NOT coalesce(o.lease_expires_at >= now(), false)
  AND (%(all)s OR num_nonnulls(%(id)s::bigint, %(topic)s::text) > 0)
  AND (%(id)s::bigint IS NULL OR o.id = %(id)s::bigint)
  AND (%(topic)s::text IS NULL OR o.topic = %(topic)s::text)
RETURNING o.id;

-- name: retrying_topics
-- The topics with retrying events, oldest first, at most %(limit)s: how many,
-- the age of the oldest (clamped as in oldest_pending_age), and the first
-- one's attempts, last error and next attempt. One pass over the unsent rows,
-- as status; the gauges read only the head (gauges_retrying).
WITH t AS (
    SELECT o.topic, count(*) AS retrying, min(o.id) AS event_id,
           coalesce(extract(epoch FROM now() - min(least(greatest(o.created_at, '0001-01-02 00:00:00+00'::timestamptz),
                                                         now()))), 0)::float8 AS oldest_age_seconds
    FROM {table} AS o
    WHERE /* include retrying */
    GROUP BY o.topic
    ORDER BY oldest_age_seconds DESC, o.topic
    LIMIT %(limit)s
)
SELECT t.topic, t.retrying, t.oldest_age_seconds, t.event_id, f.attempts, f.last_error,
       greatest(extract(epoch FROM least(f.deliver_at, now() + interval '100 years') - now()), 0)::float8
           AS next_attempt_in_seconds
FROM t
JOIN {table} AS f ON f.id = t.event_id
ORDER BY t.oldest_age_seconds DESC, t.topic;

-- name: gauges_retrying
-- The retrying events of each topic among the first %(exact_up_to)s unsent
-- events in claim order (as gauges reads them): failing events are old, at
-- the front of that order. Their count, and the age of the oldest.
SELECT o.topic, count(*) AS retrying,
       coalesce(extract(epoch FROM now() - min(least(greatest(o.created_at, '0001-01-02 00:00:00+00'::timestamptz),
                                                     now()))), 0)::float8 AS oldest_age_seconds
FROM (SELECT topic, state, attempts, lease_expires_at, created_at FROM {table}
      WHERE state = 'pending' ORDER BY priority DESC, id LIMIT %(exact_up_to)s) AS o
WHERE /* include retrying */
GROUP BY o.topic;

-- name: topic_lag
-- Each topic's pending events (not in flight, due or not) and the age of its
-- oldest due one, the topics with the oldest first, at most %(limit)s; and how
-- many topics have pending events. One pass over the unsent rows, as status.
SELECT o.topic, count(*) AS pending,
       coalesce(extract(epoch FROM now() - min(least(greatest(o.created_at, '0001-01-02 00:00:00+00'::timestamptz),
                                                     now())) FILTER (WHERE o.deliver_at <= now())), 0)::float8
           AS oldest_pending_age_seconds,
       count(*) OVER () AS topic_count
FROM {table} AS o
WHERE o.state = 'pending' AND NOT coalesce(o.lease_expires_at >= now(), false)
GROUP BY o.topic
ORDER BY oldest_pending_age_seconds DESC, pending DESC, o.topic
LIMIT %(limit)s;

-- name: retrying
-- Not a statement: the condition for a retrying event of o (relay/store/base.py,
-- is_retrying): pending with a failed attempt behind it, and not in its first try.
(o.state = 'pending' AND o.attempts > CASE WHEN o.lease_expires_at >= now() THEN 1 ELSE 0 END)

-- name: skip
-- Give up on one dead-lettered (or waiting, not in flight) event so the
-- later events of its key can flow. An event whose lease is live, or ended
-- less than %(grace)s seconds ago, is refused: its relay may still be
-- publishing it, and skipping it would let the key's next event overtake it.
-- That holds for a dead letter whose lease expired too (reap_exhausted keeps
-- the lease's end), and for an event another relay took over from such a
-- lease and settled (retry: its end is the settle's); a relay that settled an
-- event it claimed afresh ended its lease.
WITH target AS (
    SELECT id,
           state IN ('pending', 'failed')
               AND coalesce(lease_expires_at >= now() - make_interval(secs => %(grace)s), false) AS in_flight,
           state IN ('pending', 'failed') AS unsent
    FROM {table}
    WHERE id = %(id)s
    FOR UPDATE
), skipped AS (
    UPDATE {table} AS o
    -- failed_at holds the skip: retention ages a skipped event from it (purge_batch).
    SET state = 'skipped', lease_expires_at = NULL, claim_token = NULL, failed_at = now(),
        -- after the last error, if there was one
        last_error = coalesce(o.last_error || ' ', '') || '[skipped by operator]'
    FROM target AS t
    WHERE o.id = t.id AND t.unsent AND NOT t.in_flight
    RETURNING o.id
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM skipped) THEN 'skipped'
            WHEN (SELECT in_flight FROM target) THEN 'in_flight'
            ELSE 'not_found' END AS outcome;

-- name: notify_channel
-- What the table's NOTIFY trigger (%(trigger)s) names as its channel: its
-- argument, fixed by migrate from the name it was given. Another spelling of
-- the table (outbox, public.outbox, or either through search_path) finds it.
SELECT t.tgargs AS args
FROM pg_trigger AS t
WHERE t.tgrelid = %(table_name)s::regclass AND t.tgname = %(trigger)s;

-- name: check_table
SELECT 1 FROM {table} LIMIT 0;

-- name: table_columns
-- The columns of a table (%(table_name)s, quoted), for checks at start-up.
SELECT a.attname::text AS name
FROM pg_attribute AS a
WHERE a.attrelid = %(table_name)s::regclass AND a.attnum > 0 AND NOT a.attisdropped;

-- name: view_columns
-- The columns of a table (%(table_name)s, quoted) that its Debezium view
-- (%(view_name)s, quoted) reads, as the view was last built: a column added
-- to the table since, or past the view's cap on header columns, is not there.
SELECT DISTINCT a.attname::text AS name
FROM pg_rewrite AS r
JOIN pg_depend AS d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
JOIN pg_attribute AS a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE r.ev_class = %(view_name)s::regclass AND d.refobjid = %(table_name)s::regclass AND a.attnum > 0;

-- name: check_writable
-- The table is there and the relay may write it: a read-only transaction (a
-- hot standby, or default_transaction_read_only on) refuses FOR UPDATE with
-- the same error as a claim, even when no row is locked. Admin reads skip it.
SELECT 1 FROM {table} LIMIT 0 FOR UPDATE;

-- name: skip_check
-- What skip would do to one event, changing nothing (skip --dry-run).
SELECT CASE WHEN NOT (state IN ('pending', 'failed')) THEN 'not_found'
            WHEN coalesce(lease_expires_at >= now() - make_interval(secs => %(grace)s), false) THEN 'in_flight'
            ELSE 'skipped' END AS outcome
FROM {table}
WHERE id = %(id)s;

-- name: inspect
SELECT id, topic, key, payload::text, payload_bytes, content_type, headers, idempotency_key, deliver_at, priority, state,
       attempts, last_error, lease_owner, claim_token, lease_expires_at, created_at,
       published_at, failed_at
FROM {table}
WHERE id = %(id)s;

-- name: purge_batch
-- Delete at most %(limit)s sent or skipped events older than the cut-off.
-- Small batches, each its own short transaction: no long locks, and vacuum
-- can keep up. Unsent events (pending, in flight, dead-lettered) are never
-- touched. A sent event is aged from its publish, a skipped one from its skip
-- (failed_at, set by skip), one from before that from its dead letter or write.
DELETE FROM {table}
WHERE id IN (
    SELECT id FROM {table}
    WHERE state IN ('sent', 'skipped')
      AND coalesce(published_at, failed_at, created_at) < now() - make_interval(secs => %(older_than)s)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
);

-- name: purge_select
-- The next batch of events purge_batch would delete, in id order after %(after)s (purge --dry-run).
SELECT id FROM {table}
WHERE state IN ('sent', 'skipped')
  AND coalesce(published_at, failed_at, created_at) < now() - make_interval(secs => %(older_than)s)
  AND (%(after)s::bigint IS NULL OR id > %(after)s::bigint)
ORDER BY id
LIMIT %(limit)s;

-- name: replay_select
-- The next batch of kept (already sent) events a replay sends again, with
-- their idempotency keys, so consumers that already have them drop the
-- copies: at most %(limit)s, in id order after %(after)s. Every kept event
-- only with %(all)s: an empty filter matches nothing.
SELECT id FROM {table}
WHERE state = 'sent'
  AND id IS NOT NULL  -- Debezium's layout: rows from before its migrate have no place in the order
  AND (%(after)s::bigint IS NULL OR id > %(after)s::bigint)
  AND (%(all)s OR num_nonnulls(%(since)s::timestamptz, %(until)s::timestamptz, %(key)s::text, %(topic)s::text) > 0)
  AND (%(since)s::timestamptz IS NULL OR published_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR published_at < %(until)s::timestamptz)
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
  AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
ORDER BY id
LIMIT %(limit)s;

-- name: replay
-- One batch from replay_select; a row changed meanwhile is no longer sent.
UPDATE {table}
SET state = 'pending', attempts = 0, deliver_at = now(), published_at = NULL,
    lease_expires_at = NULL, claim_token = NULL, lease_owner = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'sent'
RETURNING id;

-- name: keys_waiting_on_schedule
-- Not a statement: a piece that status and gauges include (relay/store/sql.py).
-- It counts, among the keys in their column scheduled_keys (keys with an event
-- not due yet), those whose oldest unsent event is not due yet while a later
-- event of the key is due: two probes of the key index per key, none when
-- there is none.
(SELECT count(*)
 FROM unnest(scheduled_keys) AS k(key)
 CROSS JOIN LATERAL (
     SELECT o.id, o.state = 'pending' AND o.deliver_at > now()
                  AND NOT coalesce(o.lease_expires_at >= now(), false) AS scheduled
     FROM {table} AS o
     WHERE o.key = k.key AND o.state IN ('pending', 'failed')
     ORDER BY o.id
     LIMIT 1
 ) AS first
 WHERE first.scheduled
   AND EXISTS (SELECT 1 FROM {table} AS later
               WHERE later.key = k.key AND later.id > first.id
                 AND later.state = 'pending' AND later.deliver_at <= now())
)
