-- Named queries of the MySQL store. "-- name: X" starts query X. {table} is
-- an identifier in backticks (relay/store/mysql/sql.py); %(x)s are parameters
-- the driver sends escaped. MySQL 8 dialect only (no RETURNING, no LATERAL,
-- no FOR UPDATE OF), so that every statement runs on MariaDB 10.11 too.
-- Times are UTC_TIMESTAMP(6): DATETIME(6) columns hold UTC.
-- The lease columns are never NULL, and keep their width (migrations/0007):
-- no lease is lease_expires_at = '1000-01-01 00:00:00' (the smallest DATETIME,
-- before every clock, so "expired" and "not live" hold for it as they did for
-- NULL), claim_token = '' and lease_owner = ''. "Never leased, or given back"
-- is lease_expires_at = '1000-01-01 00:00:00' where it was IS NULL.

-- name: claim_candidates
-- Step 1 of the claim (inside its short transaction): lock the first
-- %(limit)s pending, due, unleased (or expired, with attempts left) rows in
-- (priority, id) order, skipping rows another claim has locked. As on
-- PostgreSQL (relay/store/queries.sql, claim), a keyed row goes in only if the
-- oldest unsent event of its key is itself, is in flight, or could be claimed
-- now and comes before it in that order: a key parked behind a dead letter or
-- a retry takes no place in the batch; a key this relay has in flight
-- (%(tail_keys)s, when %(tailed)s) skips that check, as there. The subqueries lock nothing (InnoDB
-- locks only the rows of the outer SELECT); the oldest unsent id is two
-- probes of the key index, one per state. bytes and headers_bytes are what
-- the batch byte cap counts: a JSON payload's text, a bytes payload's length,
-- and the headers' text, but nothing for '{}' (nor for NULL), so that an event
-- without headers counts its payload alone.
-- head says whether the row is its key's oldest unsent event, as the
-- statement's snapshot sees it (NULL for a row without a key): a batch with
-- no two candidates of one key (many keys, or none) is claimed from the heads
-- and from the event after each of this relay's tails (claim_tails), with no
-- read of the keys (relay/store/mysql/runs.py, lone_runs). Otherwise the claim
-- reads the candidates' keys (claim_keys), as a later statement sees them. A
-- row the snapshot does not hold (committed while the claim ran) is no head,
-- and its key waits for the next claim. Each key
-- probe reads the key index in id order and stops at its first row (ORDER BY
-- id LIMIT 1): MIN() and MAX() of a correlated subquery read every row of the
-- key instead, which made a claim of a few busy keys read millions of index
-- entries (issue 39). The row's own columns come
-- along, so that no read by token follows the commit: locked until the
-- commit, they are what the claim leases; a payload, and headers, only up to
-- %(inline_bytes)s bytes each, so that a claim of big events reads no more than
-- its byte cap of them (claim_payloads reads the others the claim leases).
SELECT o.id, o.`key`, o.topic, o.priority, o.lease_expires_at <> '1000-01-01 00:00:00' AS reaped,
       COALESCE(LENGTH(o.payload), LENGTH(o.payload_bytes)) AS bytes,
       CASE WHEN COALESCE(LENGTH(o.payload), LENGTH(o.payload_bytes)) <= %(inline_bytes)s THEN o.payload END AS payload,
       CASE WHEN COALESCE(LENGTH(o.payload), LENGTH(o.payload_bytes)) <= %(inline_bytes)s THEN o.payload_bytes END
           AS payload_bytes,
       CASE WHEN LENGTH(o.headers) > 2 THEN LENGTH(o.headers) ELSE 0 END AS headers_bytes,
       CASE WHEN LENGTH(o.headers) <= %(inline_bytes)s THEN o.headers END AS headers,
       o.content_type, o.idempotency_key, o.attempts, o.created_at,
       -- The pending probe alone: a row whose key has an older dead letter passes the WHERE only by its key's
       -- tail (where head does not matter), so the dead letters' probe would repeat what the WHERE settled. None
       -- for a key of this relay's tails: its runs go on after the tail, and never read the head.
       CASE WHEN o.`key` IS NOT NULL AND NOT (%(tailed)s AND o.`key` IN %(tail_keys)s) THEN
           (SELECT p.id FROM {table} AS p WHERE p.`key` = o.`key` AND p.state = 'pending' ORDER BY p.id LIMIT 1) = o.id
       END AS head
FROM {table} AS o
WHERE o.state = 'pending'
  AND o.deliver_at <= UTC_TIMESTAMP(6)
  AND (o.lease_expires_at = '1000-01-01 00:00:00' OR o.claim_token = ''  -- never leased, or settled (see retry)
       OR (o.lease_expires_at < UTC_TIMESTAMP(6) AND o.attempts < %(max_attempts)s))
  AND (o.`key` IS NULL OR (%(tailed)s AND o.`key` IN %(tail_keys)s)
       -- The key's head (as head below): the EXISTS would find it so, at the cost of one more lookup.
       -- A key's dead letters are probed only while the table has one: the NOT EXISTS, uncorrelated, is
       -- evaluated once a statement, in the snapshot the probes read (one for the whole statement under READ
       -- COMMITTED: tests/integration/test_mysql_claim_snapshot.py).
       OR ((SELECT p.id FROM {table} AS p WHERE p.`key` = o.`key` AND p.state = 'pending' ORDER BY p.id LIMIT 1) = o.id
           AND (NOT EXISTS (SELECT 1 FROM {table} AS n WHERE n.state = 'failed')
                OR COALESCE((SELECT d.id FROM {table} AS d WHERE d.`key` = o.`key` AND d.state = 'failed'
                             ORDER BY d.id LIMIT 1) > o.id, TRUE)))
       OR EXISTS (
        SELECT 1 FROM {table} AS f
        WHERE f.id = LEAST(
                  COALESCE((SELECT p.id FROM {table} AS p WHERE p.`key` = o.`key` AND p.state = 'pending'
                            ORDER BY p.id LIMIT 1), o.id),
                  CASE WHEN EXISTS (SELECT 1 FROM {table} AS n WHERE n.state = 'failed')
                       THEN COALESCE((SELECT d.id FROM {table} AS d WHERE d.`key` = o.`key` AND d.state = 'failed'
                                      ORDER BY d.id LIMIT 1), o.id)
                       ELSE o.id END)
          AND (f.id = o.id
               OR (f.state = 'pending' AND f.lease_expires_at >= UTC_TIMESTAMP(6))
               OR (f.state = 'pending' AND f.priority >= o.priority AND f.deliver_at <= UTC_TIMESTAMP(6)
                   AND (f.lease_expires_at = '1000-01-01 00:00:00' OR f.claim_token = ''
                        OR f.attempts < %(max_attempts)s)))))
ORDER BY o.priority DESC, o.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: claim_bury
-- Dead-letter a locked candidate no event can be made of (relay/store/mysql/store.py,
-- _unusable): inside the claim's transaction, counted as an attempt, never leased.
-- Its lease's end stays, as reap_exhausted's: none for a row never leased, and
-- for one whose lease ended, the end skip's grace counts from (that relay, of
-- other settings, may have made an event of it and still be publishing it).
UPDATE {table}
SET state = 'failed', failed_at = UTC_TIMESTAMP(6), attempts = LEAST(GREATEST(attempts, 0), 2147483646) + 1,
    last_error = LEFT(%(error)s, 16000),
    claim_token = '', lease_owner = ''
WHERE id = %(id)s AND state = 'pending';

-- name: claim_payloads
-- The payloads and headers of the rows the claim chose whose payload or
-- headers claim_candidates left out (over %(inline_bytes)s bytes): locked by
-- it, so what it leases.
SELECT id, payload, payload_bytes, headers FROM {table} WHERE id IN %(ids)s;

-- name: claim_keys
-- The unsent keyed events from the first keyed candidate (or this relay's
-- tail of a candidate's key, if earlier) to the last candidate, in id order:
-- where each key's run starts and ends (a plain read: no locks). Only when a
-- key has two candidates or more. One range of the primary key, whose
-- rows are about the claim's own: a list of the candidates' keys was read
-- key by key, and MariaDB takes a list of 1,000 values or more as a table to
-- join, reading every event of each key.
SELECT id, `key`
FROM {table} FORCE INDEX (PRIMARY)
WHERE id BETWEEN %(from)s AND %(upto)s AND `key` IS NOT NULL AND state IN ('pending', 'failed')
ORDER BY id;

-- name: claim_tails
-- Which of this relay's last events in flight (per key) still hold their
-- lease, each with the first unsent event of its key after it (NULL: none),
-- two probes of the key index that stop at their first entry past the
-- key's events up to it (for a key in flight, about its events in flight).
SELECT t.id,
       LEAST(COALESCE((SELECT p.id FROM {table} AS p WHERE p.`key` = t.`key` AND p.state = 'pending' AND p.id > t.id
                       ORDER BY p.id LIMIT 1), 9223372036854775807),
             COALESCE((SELECT d.id FROM {table} AS d WHERE d.`key` = t.`key` AND d.state = 'failed' AND d.id > t.id
                       ORDER BY d.id LIMIT 1), 9223372036854775807)) AS after_tail
FROM {table} AS t
WHERE t.id IN %(ids)s AND t.state = 'pending' AND t.claim_token IN %(mine)s AND t.lease_expires_at > UTC_TIMESTAMP(6);

-- name: claim_lease
-- Step 2: lease the chosen candidates (locked by step 1) to this claim.
-- attempts counts claims, so a lease that expires because its relay died
-- still counts as an attempt. Every column it sets keeps its width (the token
-- a CHAR(36), the owner a CHAR(80) of at most 80 bytes, the expiry a DATETIME
-- that is never NULL), so InnoDB overwrites each row where it is instead of
-- moving it (migrations/0007).
UPDATE {table}
SET claim_token = %(token)s,
    lease_owner = %(owner)s,
    lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND,
    -- One more, from 0 at least and never past the int column (relay/store/base.py, next_attempt).
    attempts = LEAST(GREATEST(attempts, 0), 2147483646) + 1
WHERE id IN %(ids)s;

-- name: reap_exhausted
-- Dead-letter events whose lease expired with no attempts left: the relays
-- holding them died or stalled every time, so another try would loop. The
-- lease's end stays, for skip_select (as on PostgreSQL).
UPDATE {table}
SET state = 'failed', failed_at = UTC_TIMESTAMP(6), claim_token = '',
    last_error = CONCAT('lease expired on attempt ', attempts, ': the relay holding it crashed or stalled')
WHERE state = 'pending'
  AND lease_expires_at < UTC_TIMESTAMP(6)
  AND lease_expires_at <> '1000-01-01 00:00:00'
  AND claim_token <> ''  -- a settled event (retry, release) is held by no relay (as on PostgreSQL)
  AND attempts >= %(max_attempts)s;

-- name: ack_delete
DELETE FROM {table}
WHERE id IN %(ids)s AND claim_token = %(token)s;

-- name: ack_keep
UPDATE {table}
SET state = 'sent', published_at = UTC_TIMESTAMP(6), lease_expires_at = '1000-01-01 00:00:00'
WHERE id IN %(ids)s AND claim_token = %(token)s;

-- name: retry
-- last_error is TEXT (64 kB): errors are cut to 16,000 characters, as every write of it below.
-- A settle ends the lease ('1000-01-01': none), but for an event the claim
-- took over from a lease that had ended (%(taken_over)s): its end is now, so
-- that skip waits out its grace for the relay that held it, which may still
-- be publishing it. So do dead_letter and release.
UPDATE {table}
SET lease_expires_at = IF(%(taken_over)s, UTC_TIMESTAMP(6), '1000-01-01 00:00:00'), claim_token = '', lease_owner = '',
    deliver_at = UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND, last_error = LEFT(%(error)s, 16000)
WHERE id = %(id)s AND claim_token = %(token)s;

-- name: dead_letter
UPDATE {table}
SET state = 'failed', failed_at = UTC_TIMESTAMP(6),
    lease_expires_at = IF(%(taken_over)s, UTC_TIMESTAMP(6), '1000-01-01 00:00:00'), claim_token = '',
    last_error = LEFT(%(error)s, 16000)
WHERE id = %(id)s AND claim_token = %(token)s;

-- name: renew_select
-- Renewing a batch's lease (a batch that waited so long after its claim that
-- its lease could end before its publish and settle are done): the events it
-- still holds, locked, while their lease holds (see renew on PostgreSQL). A row
-- another relay claimed since has another token.
SELECT id FROM {table}
WHERE id IN %(ids)s AND claim_token = %(token)s AND state = 'pending'
  AND lease_expires_at >= UTC_TIMESTAMP(6)
FOR UPDATE;

-- name: renew
UPDATE {table}
SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND
WHERE id IN %(ids)s;

-- name: release
-- Give back events that were claimed but not published: the claim does not
-- count as an attempt. A positive delay makes them due again only then; they
-- still block later events of their key.
UPDATE {table}
SET lease_expires_at = IF(id IN %(taken_over)s, UTC_TIMESTAMP(6), '1000-01-01 00:00:00'),
    claim_token = '', lease_owner = '',
    attempts = GREATEST(attempts - 1, 0),
    deliver_at = CASE WHEN %(delay_us)s > 0
                      THEN UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND
                      ELSE deliver_at END
WHERE id IN %(ids)s AND claim_token = %(token)s;

-- name: status
-- Exact counts: one pass over the unsent rows (the claim index's 'pending'
-- range and the dead letters' index).
SELECT
    COALESCE(SUM(state = 'pending' AND NOT COALESCE(lease_expires_at >= UTC_TIMESTAMP(6), FALSE)), 0) AS pending,
    COALESCE(SUM(state = 'pending' AND COALESCE(lease_expires_at >= UTC_TIMESTAMP(6), FALSE)), 0) AS in_flight,
    COALESCE(SUM(state = 'failed'), 0) AS failed,
    COUNT(DISTINCT CASE WHEN state = 'failed' THEN `key` END) AS parked_keys,
    COALESCE(SUM(state = 'pending' AND deliver_at > UTC_TIMESTAMP(6)
                 AND NOT COALESCE(lease_expires_at >= UTC_TIMESTAMP(6), FALSE)), 0) AS scheduled,
    -- Retrying (relay/store/base.py, is_retrying): pending with a failed attempt behind it, not in its first try.
    COALESCE(SUM(state = 'pending'
                 AND attempts > CASE WHEN lease_expires_at >= UTC_TIMESTAMP(6) THEN 1 ELSE 0 END), 0) AS retrying,
    COALESCE(GREATEST(TIMESTAMPDIFF(MICROSECOND,
                                    MIN(CASE WHEN state = 'pending' AND created_at >= '0001-01-01'
                                              AND attempts > CASE WHEN lease_expires_at >= UTC_TIMESTAMP(6)
                                                                  THEN 1 ELSE 0 END
                                             THEN created_at END),
                                    UTC_TIMESTAMP(6)), 0) / 1e6, 0) AS oldest_retrying_age_seconds
FROM {table}
WHERE state IN ('pending', 'failed');

-- name: retrying_topics
-- The topics with retrying events (as status counts them), oldest first, at
-- most %(limit)s: how many, the age of the oldest, and the first one's id.
-- Topics compare byte for byte (MariaDB's utf8mb4_bin pads).
SELECT CAST(topic AS BINARY) AS topic, COUNT(*) AS retrying, MIN(id) AS event_id,
       COALESCE(GREATEST(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN created_at >= '0001-01-01' THEN created_at END),
                                       UTC_TIMESTAMP(6)), 0) / 1e6, 0) AS oldest_age_seconds
FROM {table}
WHERE state = 'pending' AND attempts > CASE WHEN lease_expires_at >= UTC_TIMESTAMP(6) THEN 1 ELSE 0 END
GROUP BY CAST(topic AS BINARY)
ORDER BY oldest_age_seconds DESC, CAST(topic AS BINARY)
LIMIT %(limit)s;

-- name: retrying_firsts
-- The first retrying event of each topic retrying_topics found: its attempts,
-- last error and when it is due again.
SELECT id, attempts, last_error,
       GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), deliver_at), 0) / 1e6 AS next_attempt_in_seconds
FROM {table}
WHERE id IN %(ids)s;

-- name: gauges_retrying
-- The retrying events of each topic among the first %(limit)s unsent events
-- in claim order (as gauges_head reads them): their count and the oldest's age.
SELECT CAST(h.topic AS BINARY) AS topic, COUNT(*) AS retrying,
       COALESCE(GREATEST(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN h.created_at >= '0001-01-01' THEN h.created_at END),
                                       UTC_TIMESTAMP(6)), 0) / 1e6, 0) AS oldest_age_seconds
FROM (SELECT topic, attempts, lease_expires_at, created_at FROM {table}
      WHERE state = 'pending'
      ORDER BY priority DESC, id
      LIMIT %(limit)s) AS h
WHERE h.attempts > CASE WHEN h.lease_expires_at >= UTC_TIMESTAMP(6) THEN 1 ELSE 0 END
GROUP BY CAST(h.topic AS BINARY);

-- name: topic_lag
-- Each topic's pending events (not in flight, due or not) and the age of its
-- oldest due one, the topics with the oldest first, at most %(limit)s; and how
-- many topics have pending events.
SELECT CAST(topic AS BINARY) AS topic, COUNT(*) AS pending,
       COALESCE(GREATEST(TIMESTAMPDIFF(MICROSECOND,
                                       MIN(CASE WHEN deliver_at <= UTC_TIMESTAMP(6) AND created_at >= '0001-01-01'
                                                THEN created_at END),
                                       UTC_TIMESTAMP(6)), 0) / 1e6, 0) AS oldest_pending_age_seconds,
       COUNT(*) OVER () AS topic_count
FROM {table}
WHERE state = 'pending' AND NOT COALESCE(lease_expires_at >= UTC_TIMESTAMP(6), FALSE)
GROUP BY CAST(topic AS BINARY)
ORDER BY oldest_pending_age_seconds DESC, pending DESC, CAST(topic AS BINARY)
LIMIT %(limit)s;

-- name: keys_waiting_on_schedule
-- Among the keys with an event not due yet, those whose oldest unsent event
-- is not due yet while a later event of the key is due.
-- "No event in that state" is the largest id, not a smaller one: a row by hand
-- may have any id, and the key has a pending event, so LEAST gives its first.
SELECT COUNT(*) AS waiting
FROM (
    SELECT k.`key`,
           LEAST(COALESCE((SELECT MIN(p.id) FROM {table} AS p WHERE p.`key` = k.`key` AND p.state = 'pending'),
                          9223372036854775807),
                 COALESCE((SELECT MIN(d.id) FROM {table} AS d WHERE d.`key` = k.`key` AND d.state = 'failed'),
                          9223372036854775807)) AS first_id
    FROM (SELECT DISTINCT `key` FROM {table}
          WHERE state = 'pending' AND deliver_at > UTC_TIMESTAMP(6) AND `key` IS NOT NULL) AS k
) AS w
JOIN {table} AS f ON f.id = w.first_id
WHERE f.state = 'pending' AND f.deliver_at > UTC_TIMESTAMP(6)
  AND NOT COALESCE(f.lease_expires_at >= UTC_TIMESTAMP(6), FALSE)
  AND EXISTS (SELECT 1 FROM {table} AS later
              WHERE later.`key` = w.`key` AND later.id > f.id
                AND later.state = 'pending' AND later.deliver_at <= UTC_TIMESTAMP(6));

-- name: top_priority_below
-- The next priority of pending events below %(below)s: one probe of the claim index.
SELECT MAX(priority) AS priority FROM {table} WHERE state = 'pending' AND priority < %(below)s;

-- name: oldest_due_of_priority
-- The oldest due event of one priority that no live lease holds: the earliest
-- created_at of its first hundred by id, as on PostgreSQL (one written ahead
-- of the clock must not hide the others' age). A zero date is no date.
SELECT TIMESTAMPDIFF(MICROSECOND, MIN(h.created_at), UTC_TIMESTAMP(6)) / 1e6 AS age
FROM (SELECT created_at FROM {table}
      WHERE state = 'pending' AND priority = %(priority)s AND deliver_at <= UTC_TIMESTAMP(6)
        AND lease_expires_at < UTC_TIMESTAMP(6)
        AND created_at >= '0001-01-01'
      ORDER BY priority DESC, id
      LIMIT 100) AS h;

-- name: oldest_due_below
-- The oldest due event below priority %(below)s that no live lease holds: one
-- scan, for a table with more distinct priorities than are probed one by one.
SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6 AS age
FROM {table}
WHERE state = 'pending' AND priority < %(below)s AND deliver_at <= UTC_TIMESTAMP(6)
  AND lease_expires_at < UTC_TIMESTAMP(6)
  AND created_at >= '0001-01-01';

-- name: dead
SELECT o.id, o.topic, o.`key`, o.idempotency_key, o.attempts, o.last_error, o.created_at, o.failed_at,
       (SELECT COUNT(*) FROM {table} AS later
         WHERE o.`key` IS NOT NULL AND later.`key` = o.`key` AND later.id > o.id
           AND later.state = 'pending') AS blocked_events
FROM {table} AS o
WHERE o.state = 'failed'
  AND (%(topic)s IS NULL OR CAST(o.topic AS BINARY) = CAST(%(topic)s AS BINARY))
ORDER BY o.id
LIMIT %(limit)s;

-- name: requeue_select
-- The next batch of dead letters a requeue takes: at most %(limit)s, in id order
-- after %(after)s (relay/store/batches.py). The filter refuses an empty
-- selection before this runs.
SELECT id FROM {table}
WHERE state = 'failed'
  AND (%(after)s IS NULL OR id > %(after)s)
  AND (%(id)s IS NULL OR id = %(id)s)
  -- Byte for byte: MariaDB's utf8mb4_bin pads, so 'orders ' would equal 'orders'.
  AND (%(topic)s IS NULL OR CAST(topic AS BINARY) = CAST(%(topic)s AS BINARY))
  AND (%(key)s IS NULL OR `key` = %(key)s)
ORDER BY id
LIMIT %(limit)s;

-- name: lock_in_state
-- One batch of requeue or replay, locked: those of its rows still in %(state)s.
SELECT id FROM {table} WHERE id IN %(ids)s AND state = %(state)s ORDER BY id FOR UPDATE;

-- name: requeue
UPDATE {table}
SET state = 'pending', attempts = 0, failed_at = NULL, deliver_at = UTC_TIMESTAMP(6),
    lease_expires_at = '1000-01-01 00:00:00', claim_token = '', lease_owner = ''
WHERE id IN %(ids)s AND state = 'failed';

-- name: retry_now_select
-- The retrying events a retry now takes (the filter refuses an empty
-- selection before this runs): pending, with an attempt behind them, and not
-- in flight (a relay is trying it).
SELECT id FROM {table}
WHERE state = 'pending' AND attempts > 0 AND NOT COALESCE(lease_expires_at >= UTC_TIMESTAMP(6), FALSE)
  AND (%(id)s IS NULL OR id = %(id)s)
  AND (%(topic)s IS NULL OR CAST(topic AS BINARY) = CAST(%(topic)s AS BINARY))
ORDER BY id
FOR UPDATE;

-- name: retry_now
-- Due now; attempts stay as they are.
UPDATE {table}
SET deliver_at = UTC_TIMESTAMP(6)
WHERE id IN %(ids)s AND state = 'pending' AND NOT COALESCE(lease_expires_at >= UTC_TIMESTAMP(6), FALSE);

-- name: skip_select
-- Give up on one dead-lettered (or waiting, not in flight) event so the later
-- events of its key can flow. An event whose lease is live, or ended less
-- than %(grace_us)s microseconds ago, is refused: its relay may still be
-- publishing it. That holds for a dead letter whose lease expired too, and
-- for an event another relay took over from such a lease and settled (retry).
SELECT state IN ('pending', 'failed') AS unsent,
       state IN ('pending', 'failed')
           AND COALESCE(lease_expires_at >= UTC_TIMESTAMP(6) - INTERVAL %(grace_us)s MICROSECOND, FALSE) AS in_flight
FROM {table}
WHERE id = %(id)s
FOR UPDATE;

-- name: skip
-- failed_at holds the skip: retention ages a skipped event from it (purge_batch).
UPDATE {table}
SET state = 'skipped', lease_expires_at = '1000-01-01 00:00:00', claim_token = '', failed_at = UTC_TIMESTAMP(6),
    -- after the last error, if there was one
    last_error = CONCAT(COALESCE(CONCAT(LEFT(last_error, 16000), ' '), ''), '[skipped by operator]')
WHERE id = %(id)s;

-- name: check_table
SELECT 1 FROM {table} LIMIT 0;

-- name: check_writable
-- The table is there and the relay may write it: a read-only server (1290),
-- or a read-only transaction (1792), refuses this update though it matches no row.
UPDATE {table} SET attempts = attempts WHERE id = -1;

-- name: binlog
SELECT @@global.log_bin AS log_bin, @@global.binlog_format AS binlog_format;

-- name: inspect
SELECT id, topic, `key`, payload, payload_bytes, content_type, headers, idempotency_key, deliver_at, priority, state,
       attempts, last_error, lease_owner, claim_token, lease_expires_at, created_at,
       published_at, failed_at
FROM {table}
WHERE id = %(id)s;

-- name: purge_batch
-- Delete at most %(limit)s sent or skipped events older than the cut-off,
-- each batch its own short statement. Unsent events are never touched. A sent
-- event is aged from its publish, a skipped one from its skip (failed_at).
DELETE FROM {table}
WHERE state IN ('sent', 'skipped')
  AND COALESCE(published_at, failed_at, created_at) < UTC_TIMESTAMP(6) - INTERVAL %(older_us)s MICROSECOND
ORDER BY id
LIMIT %(limit)s;

-- name: purge_select
-- The next batch of events purge_batch would delete, in id order after %(after)s (purge --dry-run).
SELECT id FROM {table}
WHERE state IN ('sent', 'skipped')
  AND COALESCE(published_at, failed_at, created_at) < UTC_TIMESTAMP(6) - INTERVAL %(older_us)s MICROSECOND
  AND (%(after)s IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s;

-- name: replay_select
-- The next batch of kept events a replay takes, as requeue_select.
SELECT id FROM {table}
WHERE state = 'sent'
  AND (%(after)s IS NULL OR id > %(after)s)
  AND (%(since)s IS NULL OR published_at >= %(since)s)
  AND (%(until)s IS NULL OR published_at < %(until)s)
  AND (%(key)s IS NULL OR `key` = %(key)s)
  AND (%(topic)s IS NULL OR CAST(topic AS BINARY) = CAST(%(topic)s AS BINARY))
ORDER BY id
LIMIT %(limit)s;

-- name: replay
UPDATE {table}
SET state = 'pending', attempts = 0, deliver_at = UTC_TIMESTAMP(6), published_at = NULL,
    lease_expires_at = '1000-01-01 00:00:00', claim_token = '', lease_owner = ''
WHERE id IN %(ids)s AND state = 'sent';

-- name: gauges_head
-- The status figures for the relays' gauges at a bounded cost: the first
-- %(exact_up_to)s + 1 unsent events in claim order (the claim index). When
-- that is all of them, the counts are exact, as in status; past it the caller
-- takes the table's row estimate (gauges_estimate) for the unsent count.
SELECT COUNT(*) AS unsent,
       COALESCE(SUM(COALESCE(h.lease_expires_at >= UTC_TIMESTAMP(6), FALSE)), 0) AS in_flight,
       COALESCE(SUM(h.deliver_at > UTC_TIMESTAMP(6) AND NOT COALESCE(h.lease_expires_at >= UTC_TIMESTAMP(6), FALSE)),
                0) AS scheduled
FROM (SELECT lease_expires_at, deliver_at FROM {table}
      WHERE state = 'pending'
      ORDER BY priority DESC, id
      LIMIT %(limit)s) AS h;

-- name: gauges_failed
-- Dead letters and the keys they park: the failed index's range, always exact.
SELECT COUNT(*) AS failed, COUNT(DISTINCT `key`) AS parked_keys
FROM {table}
WHERE state = 'failed';

-- name: gauges_estimate
-- InnoDB's estimate of the table's rows (kept ones included), for a backlog past the exact bound.
SELECT COALESCE(MAX(table_rows), 0) AS estimate
FROM information_schema.tables
WHERE table_schema = COALESCE(%(schema)s, DATABASE()) AND table_name = %(name)s;

-- name: gauges_keys_waiting
-- keys_waiting_on_schedule as in status, for at most 1,000 of the keys with a
-- scheduled event among the first %(limit)s unsent events: a lower bound past that.
SELECT COUNT(*) AS waiting
FROM (
    SELECT k.`key`,
           LEAST(COALESCE((SELECT MIN(p.id) FROM {table} AS p WHERE p.`key` = k.`key` AND p.state = 'pending'),
                          9223372036854775807),
                 COALESCE((SELECT MIN(d.id) FROM {table} AS d WHERE d.`key` = k.`key` AND d.state = 'failed'),
                          9223372036854775807)) AS first_id
    FROM (SELECT DISTINCT x.`key`
          FROM (SELECT `key`, deliver_at FROM {table}
                WHERE state = 'pending'
                ORDER BY priority DESC, id
                LIMIT %(limit)s) AS x
          WHERE x.deliver_at > UTC_TIMESTAMP(6) AND x.`key` IS NOT NULL
          LIMIT 1000) AS k
) AS w
JOIN {table} AS f ON f.id = w.first_id
WHERE f.state = 'pending' AND f.deliver_at > UTC_TIMESTAMP(6)
  AND NOT COALESCE(f.lease_expires_at >= UTC_TIMESTAMP(6), FALSE)
  AND EXISTS (SELECT 1 FROM {table} AS later
              WHERE later.`key` = w.`key` AND later.id > f.id
                AND later.state = 'pending' AND later.deliver_at <= UTC_TIMESTAMP(6));
