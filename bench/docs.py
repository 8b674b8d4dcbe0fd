"""docs/performance.md, rendered from one run's results (and the last profile, if any)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench import report
from bench.baselines import RABBIT_WINDOW
from relay.config import BATCH_SIZE, PIPELINE_DEPTH
from relay.sinks.kafka import LINGER_MS

PROFILE_PATH = Path(__file__).parent / "results" / "profile.json"
GAUGES_PATH = Path(__file__).parent / "results" / "gauges.json"
GAUGES_HEADING = "## Table gauges on big tables"

METHOD = f"""\
## What is measured

Every figure sits next to a baseline measured in the same run, on the same
machine, moments before or after: on a shared two-core machine absolute rates
move by 2x from minute to minute, ratios much less.

Baselines:

- **L_db**: the cheapest possible drain of the same rows (a copy of the same
  migrated, seeded table): `DELETE FROM outbox WHERE id IN (SELECT id FROM
  outbox ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING id, topic,
  key, payload, headers, idempotency_key` in a loop, rows fetched into Python,
  no broker.
- **L_kafka**: confluent-kafka producing the same number of messages with the
  relay's own producer settings (`relay.sinks.kafka.producer_config`), a
  delivery callback per message, until every report is in.
- **L_rmq**: pika with pipelined publisher confirms (at most {RABBIT_WINDOW:,}
  unconfirmed, what the relay's {PIPELINE_DEPTH} batches of {BATCH_SIZE:,} in
  flight hold), persistent and mandatory, to a
  durable queue on the default exchange, until every confirm is in.
- **L_commit**: back-to-back one-row business transactions (`INSERT INTO
  business`) on one connection.
- **L_latency**: the broker's own latency floor at S2's rate: a raw
  confluent-kafka producer (the relay's settings, so `linger.ms` {LINGER_MS}) sending
  by the clock, timed to its delivery report and to the same kind of
  consumer S2 uses. Tansu answers fetches late (its consumers see messages
  tens of milliseconds after the ack) and stops serving a consumer that
  polls with a 1 ms fetch wait, so the consumers wait up to 25 ms per fetch;
  S2's latencies are to be read against this floor.

L_db, L_kafka and L_rmq are each taken before and after the drain they are
compared with, and the mean is the baseline, so a machine that gets busier
or quieter in between moves both sides of the ratio alike. The broker
baselines run in a process of their own, as the relay does, with a consumer
reading alongside as during S1, so the broker does the same work in both.

Scenarios:

- **S1 drain**: N events (default 200,000; `--long` 1,000,000) are already in
  the outbox (~200 bytes of JSON each, keys `'order-' || (g % 50000)`), then
  one `outbox-relay run` process starts with default settings. A consumer
  reading every partition (Kafka, 4 partitions) or the queue named after the
  topic (RabbitMQ, default exchange) timestamps arrivals; the rate is taken
  between 10% and 90% received. Run again with every key null for the
  unordered path, right after each keyed drain (with `--repeat`, the pairs
  alternate), so the ordered/unordered ratio compares neighbours.
- **S3 backlog**: in S1, the rate between 80% and 90% received over the rate
  between 10% and 20%: does the claim slow down as the front of the table
  fills with dead rows?
- **S2 steady**: writers offer a fixed rate by the wall clock (open loop,
  several connections), each event a one-row business transaction plus
  `producers.publish`. The rate is half the S1 Kafka rate, capped at half of
  what the writers reach flat out on this machine (the writers share its two
  cores with PostgreSQL, the relay and the broker). Latency is
  **commit-to-ack**, the target's figure: from the writer's COMMIT
  returning to the broker's acknowledgement reaching the relay. The relay
  runs as `python -m bench.acked_relay run ...`, the same CLI with the
  loop's judging step wrapped to note `time.monotonic()` per acknowledged
  event (one clock for all processes on the machine); the store's claim is
  wrapped the same way, which splits commit-to-ack into the database leg
  (**commit-to-claimed**: the claim returned the event to the relay) and the
  broker leg (**claimed-to-ack**, event by event). **Commit-to-consume**
  (to a consumer fetching the message) is shown too; it adds the broker's
  hand-over to a consumer (see L_latency). The first 10% of each run is
  warm-up and left out. The relay's own metric, from the row's `created_at`
  (the writer's transaction start) to the broker's ack, is read from its
  `outbox_relay_publish_latency_seconds` histogram (bucket-interpolated).
  Run with the NOTIFY trigger on (default) and off (`outbox-relay migrate
  --no-notify`, relay `--no-listen`).
- **S4 long transaction**: S2's load, then a REPEATABLE READ transaction that
  has read the outbox stays open (60 s; `--long` 10 min). Claim time is the
  relay's own `outbox_relay_claim_duration_seconds` histogram (mean before vs
  during, and over the last 10 s of the hold), dead tuples come from
  `pg_stat_user_tables`, and every committed event must arrive (an event
  that is neither received nor still in the outbox counts as lost).
- **Writer cost**: L_commit against the same transaction with
  `producers.publish()` in it, into an outbox table with the NOTIFY trigger
  on and into a second one with it off. The three kinds take turns
  transaction by transaction on one connection for 30 s, so the machine's
  slow moments fall on all of them alike; each rate is one over the mean
  duration, leaving out the slowest 1%.
- **Relay cost**: CPU seconds (utime + stime of the relay process, all
  threads, from `/proc/PID/stat`) per 1,000 events between 10% and 90% of S1,
  and peak RSS (`VmHWM`).
- **Machine CPU per event** (`bench/cpu.py`): the whole machine's busy time
  (`/proc/stat`, without idle, iowait and steal) between 10% and 90% of each
  drain, and during each L_db loop, split by process group: the relay,
  PostgreSQL (every `postgres` process), the broker (Tansu, or RabbitMQ's
  Erlang VM), the bench's own process (L_db's client, or the measuring
  consumer), kernel threads, and the rest. It says where a ratio below 1
  goes: L_db has PostgreSQL and one client to itself, S1 also carries the
  relay, the broker and a consumer on the same two cores.
"""


#: Levers measured by hand (not re-run by ``make bench``); dated, with how.
TRIED = """\
## Levers tried, and what the numbers said

Measured 2026-11-29 on this machine, with the commands given; each line is
a comparison taken back to back in one sitting, as ratios where the machine
was busy.

- **The machine's load moves every figure by 2x or more.** The same tree gave
  S1 Kafka 8,899/s (0.43 x L_db, ordered/unordered 0.60, S3 0.75) with the
  load average at 5 to 13 from parallel test runs, and 36,192/s (0.56 x L_db,
  ordered/unordered 0.86, S3 1.00; median of three, `--repeat 3`) with it
  below 1. Read a run's ratios together with its date and load.
- **The database side of the lease design is not the limit.** A bare loop of
  the relay's own claim and `ack_delete` statements (one connection,
  `synchronous_commit` off, 100,000 seeded rows, no broker) drained 66,700
  keyed and 81,900 null-key events/s against 79,500-80,700/s for L_db in
  the same sitting: 0.84 and 1.02 x L_db. On a quiet table the claim of
  1,000 keyed rows executes in 9.3 ms (its per-key `NOT EXISTS` probe 3 ms;
  EXPLAIN ANALYZE's per-node timing, used in the profile above, inflates
  both, the loop times the statements without it).
  The end-to-end S1 ratio (0.55-0.66) is lower because the drain shares two
  cores between PostgreSQL, the relay, Tansu and the measuring consumer;
  L_db runs with neither broker nor consumer. Per-process accounting
  (`bench/cpu.py`, three 100,000-event keyed drains on a quiet machine):
  PostgreSQL 20.8-23.4 us of CPU per event, the relay 18.6-22.3 us, Tansu
  4.9-6.2 us, the consumer about 2.5 us, kernel threads under 1 us (an
  earlier reading of "0.8 of a core of `kworker` writeback" came from
  system-wide counters and does not survive per-process counting), with the
  machine 75-78% busy: the loop waits on one claim at a time rather than
  for CPU. L_db in the same runs: PostgreSQL 10.9 us per event, its Python
  client 19.4 us (psycopg decodes every payload's JSON; the relay fetches it
  as text).
- **A lock-holding claim, database side only** (`SELECT ... FOR UPDATE SKIP
  LOCKED` with the claim's own per-key rule, then `DELETE` in the same
  transaction, against the relay's claim and `ack_delete`; one connection,
  100,000 keyed rows, three rounds): 1.38-1.46 x L_db against 1.10-1.25 x for
  the lease, about a fifth faster; 497 bytes of WAL per event against 636,
  18-20 us of machine CPU per event against 22-24. Against the 47-54 us the
  whole S1 drain spends per event, that is worth under a tenth of S1, and it
  would give up the claim-time attempt count that dead-letters events whose
  relay keeps crashing (it would need a claim journal instead) and the lease
  columns operators read. End to end, a bench-only prototype of the CLI
  (claim and delete in one transaction per batch, on a pool of connections)
  drained 100,000 keyed events at 25,666/24,794/27,640 events/s against
  28,258/27,722/29,982 for the committed relay, claims taking 32-36 ms
  against 30-32: each claim steps over the rows that the batches in flight
  hold locked. With the floor moved to the claim frontier (unsafe for late
  commits, a measurement only) it spent 11-12 us of PostgreSQL CPU per event,
  L_db's level, and drained 5-9% faster than the lease with the same floor;
  the relay's own Python then sets the pace. Not built.
- **Rows found by ctid instead of id** (the claim joining its candidates on
  `ctid`, the settle deleting `ctid = ANY(...)` with the token check): on the
  server, EXPLAIN ANALYZE gave the claim 14.7 ms against 15.5-19.3 ms and the
  settle 1.35 ms against 2.6 ms per 1,000 rows; end to end, three keyed
  100,000-event drains back to back with the committed relay gave
  31,157/31,047/29,391 events/s against 33,387/30,838/29,432. A gain the drain
  cannot show does not pay for reasoning about reused slots; dropped.
- **A floor at the claim frontier** (a measurement-only prototype, unsafe for
  late commits): PostgreSQL's CPU per event 20.9-24.2 us against 27.2-27.7,
  drain rate within the noise (23,685-26,388/s against 23,231-23,845/s);
  turning the full scans off changed nothing either. The floor's lag of about
  a second of dead index entries is not what holds S1 back.
- **`linger.ms` (S1 and S2 back to back, two rounds, 200,000 events):**
  5 ms gave S1 0.60 and 0.58 x L_db, 1 ms 0.54 and 0.52, 0 ms 0.48 and
  0.46; S2 commit-to-ack p50 was 16.7/17.0 ms at 5, 16.0/15.7 at 1 and
  13.1/14.5 at 0, at 978 events/s with the writers themselves running up to
  120 ms behind schedule. The relay keeps 5; `kafka://...?linger.ms=0` buys
  about 3 ms of latency for about a fifth of the drain rate. Per-process
  accounting later showed why: at 0 ms Tansu spends 11.3-11.6 us of CPU per
  event against 5.9-7.8 at 5 ms (one request per few messages), CPU the
  drain needs for PostgreSQL.
- **Sending each batch at once** (the produce thread calling
  `producer.flush(0.005)` after enqueueing a batch: while a flush runs,
  librdkafka ignores `linger.ms`; a flush of 1 ms or `flush(0)` returns
  before the broker thread wakes and changes nothing). Alone, ten messages
  were acknowledged in 1.7-1.9 ms against 7-8 ms at `linger.ms` 5. In S2
  (700 events/s, 15 s per mode, three rounds alternated), commit-to-ack p50
  13.4/21.2/15.1 ms against 16.7/16.3/17.2 ms without, but p99
  38.6/70.2/81.2 ms against 48.0/41.1/43.5: the flush holds the one produce
  thread for up to 5 ms per batch, so the next batch waits. Not kept.
- **Where S2's commit-to-ack goes** (the stamping relay stamping at other
  points, 700 events/s, NOTIFY on): commit to the claim returning the event
  p50 4.8 ms, p99 16.6 ms; commit to the publish call starting 5.3/20.9 ms;
  commit to ack 16-27 ms at p50. The database leg meets the target; the broker
  leg (librdkafka's linger, Tansu's acknowledgement, the hand-back to the
  event loop) is most of the rest. `make bench` now reports both legs.
- **Pipeline depth 3 and batches of 500 or 2,000** moved S1 by less than the
  run-to-run noise (30,400-36,300/s).
- **Two claims at once.** The profile shows the loop waiting on one claim at a
  time for 91% of a drain, so a prototype ran two claims concurrently on two
  connections whenever the last claim came back full (pipeline depth 4). Back
  to back with the committed relay, two rounds: 0.55 and 0.53 x L_db against
  0.58 and 0.55. The claims are slow because the two cores are busy, not
  because they wait for each other; the prototype was dropped.
- **pika's one `send` per frame.** A py-spy profile of the RabbitMQ drain
  had 22% of the relay's CPU samples in the socket `send` of pika's
  transport: pika hands the transport each frame alone (a message is a
  method, a header and a body frame) and the transport sends each with its
  own system call. The sink now holds the frames of each chunk of published
  messages and writes them as one (`_CorkedConnection`; a test counts one
  write for a batch of 300 where pika made 900). RabbitMQ drains of 100,000
  keyed events, two rounds back to back with the previous relay: relay CPU
  34.6/38.2 us per event against 52.0/52.1, RabbitMQ's own 40.0/42.4 against
  48.3/50.4, drain 13,508/12,376 events/s against 10,373/10,208 (+21-30%),
  the machine 89-94% busy in both. L_rmq is raw pika and still sends frame by
  frame.
- **pika's marshalling.** With the writes joined, pika building each
  message's frames object by object (`BasicProperties`, `Frame.marshal`,
  short strings byte by byte) was about 40% of the relay's samples. The sink
  now packs the three frames of its one message shape with `struct`
  (`relay.sinks.rabbitmq.publish_frames`; a test compares the bytes with
  pika's own for unicode, empty, multi-frame and longest-name messages).
  Two rounds back to back: relay CPU 28.7/28.9 us per event against
  42.0/41.6, drain 12,314/12,655 events/s against 10,696/10,696 (+15-18%).
- **The relay's per-event Python (microbenchmarks, 1,000 events):** one
  histogram update per batch (`relay.metrics.observe_many`, the buckets
  counted by bisecting the sorted latencies) instead of `observe` per event:
  0.27 ms against 1.39 ms; the settle's ids sent as one array literal instead
  of a list psycopg adapts item by item: 0.42 ms against 1.25 ms per
  statement, round trip included; str keys and header values handed to
  confluent-kafka, which encodes them in C, instead of encoding them in
  Python: produce calls 1.83 ms against 2.29 ms. Together 2.4 us less per
  event, about a tenth of the relay's CPU on the Kafka drain.
- **`publish()` cost (`python -m bench --only writer`, and a one-connection
  loop of 4,000-6,000 transactions per kind):** the headers check called a SQL
  function per row, run through its own executor: 0.12-0.13 ms of a 0.54-0.75
  ms business transaction. Migration 0002 states the same rule with built-in
  operators and a strict JSON path, which costs nothing measurable: the
  overhead fell from +84% to +64% in one loop. What is left is a second
  statement: another INSERT into a plain two-column table costs +25% by itself
  here (one more round trip on a transaction whose COMMIT flushes WAL in about
  0.5 ms), and a row with a JSON payload, a unique key and a primary key +41%.
  The NOTIFY trigger and the two partial indexes each cost under 4%. The
  10% target is below the price of one extra statement on this machine.
- **The claim's keyset floor (S4, `--only s4 --s4-seconds 60 --rate 959`).**
  Mean claim time during the 60 s transaction over before it: 5.85x (11.3x
  over the last 10 s) scanning the claim index from the start every time;
  2.75x (3.65x) with a floor set by full scans only, one a second; 2.30x
  (2.77x) with full scans spaced by 20 times their own duration; 1.64x
  (1.95x, at 900/s) with every claim moving the floor once it is a second
  old, so hinted claims step over about a second of dead entries instead of
  up to two full-scan spacings. What still grows with the transaction's age
  (the per-key probe meeting dead entries of its key, HOT updates failing on
  pages that cannot be pruned) was not taken apart. S1 stayed where it was
  (median of three: keyed 0.58 x L_db, ordered/unordered 0.85, S3 0.89).
- **Polling without LISTEN spun.** The idle wait returned at once when LISTEN
  was off, so the relay claimed back to back (about 1,000 empty claims a
  second in-process). In S2 at 959 events/s, NOTIFY off gave commit-to-ack
  p50 1.86 s and p99 39 s, the relay falling behind the writers; with the
  wait fixed, the same scenario gives tens of milliseconds (see the table).
- **In-process latency without the benchmark's writers** (`Relay` and a writer
  thread in one process, 500 events/s, `linger.ms` 0): commit-to-ack p50 4.0-5.2
  ms, p99 13-23 ms. The relay's own path (NOTIFY, claim of about one event in
  1.4 ms, produce, ack) fits the 5 ms target; S2 measures it on a machine
  saturated by 24 writer connections at 50% of their capacity.

Measured 2026-11-30, on a faster machine: the same tree gave L_db 116,838/s
(34,570/s the day before), L_kafka 268,077/s, L_rmq 32,079/s and L_commit
3,072/s, and S1 Kafka 62,624/s, 0.54 x L_db: the relay did not speed up as
much as the bare SQL loop.

- **Claim batch size.** Keyed 200,000-event Kafka drains, two rounds back
  to back: 1,000 per claim 56,802/55,910 events/s, 2,000 67,991/67,891,
  4,000 70,307/69,602. A second sitting: 2,000 69,661/70,555, 4,000
  68,832/69,829, 8,000 62,261/63,062. PostgreSQL's CPU per event went from
  12.1-12.5 us at 1,000 to 10.9-11.5 at 2,000 and 4,000 (12.6-13.2 at
  8,000), Tansu's from 2.9-3.1 to 2.2 (fewer, larger produce requests). The
  default is now 2,000: the peak RSS is 57-58 MB against 63-65 MB at 4,000.
  On the slower machine of 29 November, 500 and 2,000 were within the noise.
- **Two claim loops.** Two relay loops in one process, sharing the sink and
  each with its own connections: 63,557/63,004 events/s against 58,378/58,911
  for one (+7-9%); two relay processes 66,363/63,049 (+7-14%). PostgreSQL's
  CPU per event rises from 12.2 to 14.5-15.7 us (the claims step over each
  other's rows) and the machine is 92-94% busy. Not built: a tenth more does
  not change the verdict, and running a second relay gives it to whoever
  wants it.
- **The keyed claim on the server** (EXPLAIN ANALYZE, timing off, fresh copies
  of the 200,000-row table, 1,000 rows, median of five): 8.6 ms; 4.7 ms
  without the per-key check; 8.1 ms with the key column in the "C" collation
  (this database's is C.UTF-8, compared through the C library); 8.5 ms with
  the check written as a plain `NOT EXISTS` (an anti join) instead of `key IS
  NULL OR NOT EXISTS`. Neither change is worth a migration. Under a drain
  (auto_explain, batches of 2,000) the claim executes in 21.3 ms of the 26
  ms the relay waits for it.
- **The floor follows transaction ids** (S4 at 1,800 events/s,
  auto_explain on 3% of statements). During the held transaction a hinted
  claim read 2,118 buffers on average with the floor a second behind the
  claims, 937 with it a quarter of a second behind, and 520 with the rule
  now in `relay/store/floor.py` (465 with a first version that compared
  snapshot bounds only, which a review showed could pass a writer whose
  transaction id is above every completed one). With timing on, a hinted
  claim of 16 rows spent 0.74 of its 0.9 ms stepping over about 400 dead
  entries before its first row. Full scans are about 1% of the claims but
  take 30-40 ms each. The S4 ratio itself stays in the noise of the time
  before the transaction (0.69-1.30 ms between runs): 1.82-2.57x with the
  snapshot rules against 1.88-3.70x without them.
  Spacing full scans by 50 times their duration instead of 20 changed
  nothing measurable (2.38/2.52x against 2.50/1.82x).
- **S2 on this machine** (1,800 events/s, NOTIFY on, two rounds each):
  `linger.ms` 0 gave commit-to-ack p50 7.2/9.7 ms against 12.3/12.1 ms, but
  p99 47.7/62.8 against 27.3/27.7; pipeline depth 4 and 8 cut the database
  leg's p50 to 1.2-2.0 ms (3.6-5.0 at depth 2) and commit-to-ack p50 to
  9.7-12.8 ms (11.2-14.4), but p99 reached 143-155 ms in two of the four
  runs. Neither kept.

Measured later on 2026-11-30 (the next session), with the relay stamping more
points and librdkafka's debug log where said; S2 at 1,900 events/s, 20 s per
run, variants alternated round by round.

- **Sending small batches at once.** After a batch of fewer than 500 events
  a thread called `producer.flush()` for up to `linger.ms`: librdkafka sends
  without lingering while a flush runs. On this machine even a 1 ms flush
  now works (alone, 10-event batches at 1,900/s with a consumer fetching:
  acknowledged p50/p99 1.5/7.6 ms against 6.1/8.9 at `linger.ms` 5). S2,
  three rounds against the relay at `linger.ms` 5: commit-to-ack p50
  8.1/11.1/11.7 ms against 12.1/13.4/13.9, but p99 42-152 ms against 24-42.
  librdkafka's log shows Tansu answering some produce requests in 110-115
  ms; with up to five requests in flight its round trip was p50 1.4-1.6 ms,
  p99 19-25 ms, with one (`max.in.flight` 1) 0.3 ms and 7-8 ms, and the
  tails went (p99 33/55/50 against 35/49/50, p50 8.9/13.1/11.2 against
  14.1/16.2/13.1; a keyed drain within 1%). One request at a time per
  broker connection would cap a real cluster's throughput, so that is no
  default to ship for one broker's queueing. Nudging only a batch that is
  all the producer holds: p50 10.1-11.3 against 13.6-15.0 ms, p99 34-94
  against 32-74 (six rounds). Not kept: the p50 target stays out of reach
  and the p99 one moves further away.
- **Where S2's database leg goes** (pipeline depth 2, `linger.ms` 5): per
  event, waiting for a free pipeline slot 6.2 ms on average, waiting for a
  NOTIFY 1.0 ms, the claim itself 4.1 ms (a slow run: commit-to-ack p50
  18.3 ms). The slot wait is the batch before waiting out `linger.ms` and
  its acknowledgement; a deeper pipeline moves that wait into librdkafka's
  queue (depth 8: database leg p50 2.1-3.0 ms, broker leg 11.0-13.1 ms,
  against 4.3-5.2 and 8.0-9.5 at depth 2).
- **Full scans during a long transaction** (S4, 60 s, the relay timing each
  claim): spaced by 20 times their duration, they took 30-80 ms each in the
  last 20 s and still ran every second, 13-15% of the relay's time in
  claims; spaced by 100 times, 2-6%. Kept. Whole-run S4 ratios, 2.30x and
  1.93x, sit inside the noise of the mean before the transaction (0.93 and
  1.28 ms). The hinted claims' own time grows over the 60 s (p50 1.5 to 2.4
  ms relay-side) and is now most of the rise.
- **Hinted claims entering the index at the floor.** auto_explain on a
  quarter of the relay's statements during S4: the hinted claims' buffers
  rose from 146 to 697 over the 60 s and their server time from p50 0.20 to
  1.57 ms, while the floor stayed 150-170 ids behind the newest claim. The
  index leads with priority, so `id >= floor` was checked entry by entry
  from its start, through every entry of an event sent since the
  transaction began. With `priority = ANY(the priorities seen)` added, the
  scan starts at (priority, floor). Two S4 runs: the relay's mean claim
  during the transaction 1.70 and 1.70 ms (2.15-2.94 in six runs before),
  1.61 and 2.07 ms in its last 10 s (2.99-3.52 before); the ratios, 1.61x
  and 2.00x, follow the means before the transaction (1.05 and 0.85 ms).
  Kept. Two keyed drains after it: 62,114 and 65,840 events/s, within the
  day's range.
- **A byte budget per claim** (a running sum of `pg_column_size(payload)`
  over the locked candidates, the batch cut once it passes the budget), on a
  200,000-row table, 2,000-row claims, EXPLAIN ANALYZE median of ten: 13.8
  ms against 13.1 (13.7 without an ORDER BY in the window). 4-5% of the
  claim, which is what bounds S1; not built. Lowering `--batch-size` for
  large payloads stays the advice.
- **What `publish()` costs** (one connection, seven kinds of transaction
  taking turns for 40 s, 1%-trimmed means): the business row alone 324-335
  us; a second INSERT into a two-column table +23-24%, into a two-column
  jsonb table +28%; `publish()` +54%; the outbox INSERT with only topic and
  payload +44-47%, +38% without the outbox's CHECK constraints (the headers
  check alone about 3%), +42% without the idempotency key's unique index;
  without the claim, key and dead-letter indexes +51% against +54%;
  `publish()`'s Python work alone (building its parameters) +5%. The +10%
  target is below the cost of any second statement here.

Measured 2026-11-30 from 05:30, with the machine about half as fast as in
the morning's runs (L_db 44,559-49,543/s, L_rmq 16,501-18,122/s, writers
flat out at 1,963-2,599/s against 3,876 the day before).

- **The per-key probe on a hashed key** (an expression index on
  `(hashtext(key), id)` and the probe comparing `hashtext` first; fresh
  copies of the 200,000-row table, 2,000-row claims, EXPLAIN ANALYZE with
  JIT off, nine rounds): minimum 17.1 ms against 17.7 for the text key,
  12.7 without the per-key check; medians 17.8, 23.9 and 13.7 (this noisy).
  The probe's cost is the executor's per-row subplan and index descent, not
  comparing text. Not built. With JIT on (the planner's cost estimate for
  the expression index crosses `jit_above_cost`) the same claim took 270
  ms: a schema change here needs its plan checked.
- **S2 with `linger.ms` 0** (`--only s2`, alternated, two rounds each, at
  the run's own rate of 1,000 events/s): commit-to-ack p50 11.5 and 14.0 ms
  against 16.2 and 15.6, p99 52.4 and 68.0 against 40.8 and 41.3; the
  broker leg alone p50 6.8-7.9 ms against 9.6-10.0. At 1,900 events/s, near
  the writers' capacity: p50 15.9 and 15.1 against 18.8 and 18.7, p99 63.1
  and 240.8 against 91.6 and 52.0. It buys 2-4 ms of median for a worse
  tail and, as measured earlier, a fifth of the drain rate; the default
  stays 5.
- **S3 over 1,000,000 events** (`--only s1,s1u --events 1000000`, where the
  200,000-event drains make each S3 window about 0.2 s wide): keyed S3
  0.92 (30,758/s late against 33,434/s early), null keys 0.82 (49,794/s
  against 60,933/s). S1 in the same run: keyed 30,633/s, 0.64 x L_db;
  null keys 55,674/s, 1.16 x L_db (L_db 48,125/s, mean of two).
- **The profile's phase timers** counted hinted claims (`claim_hinted`,
  most claims since the floor) as "building Events": 84% of the drain in
  Python that was really the claim's query. Fixed in `bench/profile.py`;
  the profile below is from after the fix.
"""


def _fmt_setting(settings: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(settings.items()))


def render(results: dict[str, Any]) -> str:
    """The whole performance page for ``results``."""
    m = results.get("machine", {})
    config = results.get("config", {})
    lines = [
        "# Performance",
        "",
        "Generated by `make bench` (`python -m bench`); do not edit by hand, run it again.",
        "",
        f"- Date: {m.get('date', '?')}; relay source: {m.get('source', '?')}",
        f"- Machine: {m.get('nproc', '?')} cores ({m.get('cpu', '?')}), {m.get('memory_gb', '?')} GB memory, "
        f"Linux {m.get('kernel', '?')}, Python {m.get('python', '?')}; shared with other work while measuring",
        f"- PostgreSQL {m.get('postgresql', '?')} ({_fmt_setting(m.get('postgresql_settings', {}))}), "
        f"RabbitMQ {m.get('rabbitmq', '?')}, Tansu (in-memory Kafka protocol broker)",
        f"- Run: `{config.get('command', 'python -m bench')}`, {config.get('events', 0):,} events per drain, "
        f"S2 {config.get('s2_seconds', 0):.0f} s per mode, S4 {config.get('s4_seconds', 0):.0f} s",
        "",
        "## Targets",
        "",
        "| Target | This run | Met |",
        "| --- | --- | --- |",
    ]
    for verdict in report.evaluate(results):
        met = {True: "yes", False: "**no**", None: "not run"}[verdict["met"]]
        lines.append(f"| {verdict['target']} | {verdict['shown']} | {met} |")
    l_kafka = report.dig(results, "baselines.l_kafka.rate")
    if l_kafka:
        lines += [
            "",
            f"The 30,000 events/s target is absolute; the raw client against Tansu (L_kafka) reached "
            f"{l_kafka:,.0f}/s in this run, so the ratios are the figures to compare between runs.",
        ]
    lines += [
        "",
        "## Figures",
        "",
        "| Figure | Value | Against the baseline |",
        "| --- | --: | --- |",
    ]
    lines += [f"| {name} | {value} | {note} |" for name, value, note in report.rows(results)]
    rate = results.get("s2_rate")
    if rate:
        lines += [
            "",
            f"S2 and S4 offered {rate['rate']:,.0f} events/s ({rate['why']}; half the S1 Kafka rate would be "
            f"{(rate.get('s1_rate') or 0) / 2:,.0f}/s, and the writers reach {rate['writer_capacity']:,.0f} "
            "business transactions/s flat out on this machine).",
        ]
    if results.get("errors"):
        lines += ["", "Scenarios that failed in this run: " + ", ".join(sorted(results["errors"])) + "."]
    lines += [
        "",
        "Context: the first, naive relay drained about 6,500 events/s here (0.16 x L_db).",
        "",
        METHOD,
        "## Where the time goes (S1 Kafka)",
        "",
    ]
    lines += _profile_section(results)
    lines += ["", GAUGES_HEADING, "", _gauges_section(results)]
    lines += ["", TRIED]
    lines += [
        "",
        "## Reproduce",
        "",
        "```sh",
        "make bench                                    # the default run, ~8 minutes; rewrites this page",
        "python -m bench --long                        # 1M events, 60 s steady runs, 10 min long transaction",
        "python -m bench --only s1 --events 50000      # S1 Kafka + S3 + relay cost vs L_db and L_kafka, ~1 min",
        "python -m bench --only s1 --events 50000 --repeat 3  # median of three drains, baselines around each",
        "python -m bench --only s1,s1u --events 50000  # plus ordered vs unordered",
        "python -m bench --only rmq --events 50000     # RabbitMQ drain vs L_rmq",
        "python -m bench --only s2 --s2-seconds 10     # latency, NOTIFY on and off",
        "python -m bench --only s4 --s4-seconds 20     # long transaction",
        "python -m bench --only writer                 # publish() cost on the writer",
        "python -m bench --only profile --events 100000  # where S1's time goes",
        "python -m bench --only gauges                 # status vs the relay's gauges, 100k and 1M events, ~3 min",
        "```",
        "",
        "(`python` is the project's `.venv/bin/python`.) The profile samples the relay with py-spy when",
        "it is installed (`.venv/bin/pip install py-spy`, or `BENCH_PY_SPY=/path/to/py-spy`).",
        "",
        "It needs PostgreSQL on 127.0.0.1:5432 (`BENCH_DATABASE_URL`; it creates",
        "and drops `bench_*` databases) and RabbitMQ on 127.0.0.1:5672",
        "(`BENCH_AMQP_URL`); it starts Tansu itself. Results go to",
        "`bench/results/latest.json` (not committed).",
        "",
    ]
    return "\n".join(lines)


def _profile_section(results: dict[str, Any]) -> list[str]:
    data = results.get("profile")
    if data is None and PROFILE_PATH.exists():
        try:
            data = json.loads(PROFILE_PATH.read_text())
        except ValueError:
            data = None
    if not data:
        return ["Not profiled yet: run `python -m bench --only profile`."]
    return [profile_text(data)]


def _pct(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) and not math.isnan(value) else "-"


def profile_text(data: dict[str, Any]) -> str:
    """The profile's findings as Markdown."""
    lines = [f"Profiled {data.get('date', '?')} with {data.get('events', 0):,} events."]
    wall = data.get("phases")
    if wall:
        lines += [
            "",
            f"Wall time of the in-process relay's phases ({wall['rate']:,.0f} events/s, "
            f"{wall['batches']} batches, {wall['seconds']:.1f} s; phases overlap, pipeline depth "
            f"{wall.get('pipeline_depth', '?')}):",
            "",
            "| Phase | Total | Per batch | Share of the drain's wall time |",
            "| --- | --: | --: | --: |",
        ]
        for name, phase in wall["by_phase"].items():
            lines.append(
                f"| {name} | {phase['seconds']:.2f} s | {phase['per_batch_ms']:.1f} ms | {_pct(phase['share'])} |"
            )
    cpu = data.get("cpu")
    if cpu:
        lines += [
            "",
            f"CPU samples of an `outbox-relay run` process between 10% and 90% of the drain "
            f"({cpu['tool']}, {cpu['samples']:,} samples, all threads, idle waits left out; "
            f"{cpu.get('rate', math.nan):,.0f} events/s while sampled):",
            "",
            "| Where | Share of CPU samples |",
            "| --- | --: |",
        ]
        lines += [f"| {name} | {_pct(share)} |" for name, share in cpu["by_category"].items()]
    explain = data.get("explain")
    if explain:
        lines += [
            "",
            "Server-side execution time (EXPLAIN ANALYZE on a fresh copy of the seeded table, 1,000 rows):",
            "",
            "| Statement | Execution | Planning | Parts |",
            "| --- | --: | --: | --- |",
        ]
        for name, row in explain.items():
            parts = ", ".join(f"{part} {ms:.1f} ms" for part, ms in row.get("parts_ms", {}).items() if part != "total")
            lines.append(f"| {name} | {row['execution_ms']:.1f} ms | {row['planning_ms']:.1f} ms | {parts} |")
    notes = data.get("notes")
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines)


def replace_section(page: str, heading: str, body: str) -> str:
    """``page`` with the section under ``heading`` (up to the next ``## ``) replaced by ``body``.

    A page without that section gets it before "## Reproduce", or at the end.
    """
    lines = page.split("\n")
    section = ["", heading, "", *body.split("\n"), ""]
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        return "\n".join([*lines[: start - 1 if start and not lines[start - 1] else start], *section, *lines[end:]])
    at = lines.index("## Reproduce") if "## Reproduce" in lines else len(lines)
    return "\n".join([*lines[: at - 1 if at and not lines[at - 1] else at], *section, *lines[at:]])


def _gauges_section(results: dict[str, Any]) -> str:
    data = results.get("gauges")
    if (data is None or "gauges" in results.get("errors", {})) and GAUGES_PATH.exists():
        try:
            data = json.loads(GAUGES_PATH.read_text())
        except ValueError:
            data = None
    if not data:
        return "Not measured yet: run `python -m bench --only gauges`."
    return gauges_text(data)


def _counts(status: dict[str, Any]) -> str:
    return " / ".join(f"{status[k]:,}" for k in ("pending", "in_flight", "failed", "parked_keys"))


def gauges_text(data: dict[str, Any]) -> str:
    """The gauges measurement as Markdown: cost by table size, the plans, and how close the estimate is."""
    cases = data.get("cases", [])
    lines = [
        f"Measured {data.get('date', '?')} at {data.get('source', '?')}. Each table is a throwaway database "
        "holding S1's seed rows (keyed, ~200 bytes of JSON, the migrated table), built with one INSERT ... "
        "SELECT generate_series and VACUUM ANALYZE, autovacuum off. Each time is the median of "
        f"{data.get('repeats', '?')} calls of the relay's own `PostgresStore` method after a warm-up call, "
        "from Python, round trips included. `python -m bench --only gauges` measures again (`--long` adds "
        "3,000,000 events) and rewrites this section alone.",
        "",
        "| Table | Heap + indexes | `status()`: exact, the `status` command | "
        "`gauges()`: the relay's counts, every 30 s | `oldest_pending_age()`: every 5 s |",
        "| --- | --: | --: | --: | --: |",
    ]
    for case in cases:
        calls, seed = case["calls"], case["seed"]
        lines.append(
            f"| {case['name']} | {seed['table_mb']:,.0f} + {seed['indexes_mb']:,.0f} MB "
            f"| {calls['status']['median_ms']:,.1f} ms | {calls['gauges']['median_ms']:,.1f} ms "
            f"| {calls['oldest_pending_age']['median_ms']:.2f} ms |"
        )
    budget = data.get("budget_ms", 50.0)
    bound = data.get("exact_up_to", 0) + 1
    worst = max((c["calls"]["gauges"]["median_ms"] for c in cases), default=math.nan)
    growth = ", ".join(f"{c['calls']['status']['median_ms']:,.0f} ms on {c['name']}" for c in cases if not c["mixed"])
    if cases:
        lines += [
            "",
            f"`status()` reads every unsent row: {growth}. The relays refreshed their count gauges with it "
            f"every 30 s until `gauges()` took its place there, which reads at most {bound:,} unsent events "
            f"whatever the table holds: at most {worst:,.1f} ms on these tables, "
            f"{'within' if worst <= budget else '**over**'} the budget of {budget:.0f} ms.",
        ]
    lines += [
        "",
        "Server side, EXPLAIN (ANALYZE, BUFFERS) of each query, run once before:",
        "",
        "| Table | Query | Execution | Buffers hit / read | What it reads of the outbox |",
        "| --- | --- | --: | --: | --- |",
    ]
    for case in cases:
        for i, (query, plan) in enumerate(case["explain"].items()):
            workers = f" ({plan['workers']} parallel workers)" if plan["workers"] else ""
            lines.append(
                f"| {case['name'] if i == 0 else ''} | {query} | {plan['execution_ms']:,.1f} ms "
                f"| {plan['shared_hit']:,} / {plan['shared_read']:,} | {'; '.join(plan['scans'])}{workers} |"
            )
    lines += [
        "",
        f"What the gauges report (pending / in flight / failed / parked keys). Up to "
        f"{data.get('exact_up_to', 0):,} unsent events they are exact; past that pending is an estimate "
        "and in flight counts the leases among the first events in claim order (see "
        "[Operations](operations.md#the-gauges-and-what-they-cost)):",
        "",
        "| Table | `status` (exact) | gauges |",
        "| --- | --: | --: |",
    ]
    for case in cases:
        lines.append(
            f"| {case['name']} | {_counts(case['calls']['status']['value'])} "
            f"| {_counts(case['calls']['gauges']['value'])} |"
        )
        for step in case.get("churn", []):
            lines.append(f"| {case['name']}, {step['step']} | {_counts(step['status'])} | {_counts(step['gauges'])} |")
    for case in cases:
        if case["mixed"]:
            in_flight = case["calls"]["status"]["value"]["in_flight"]
            lines += [
                "",
                f"{in_flight:,} events in flight at once would take some "
                f"{in_flight / (BATCH_SIZE * PIPELINE_DEPTH):,.0f} relays at the default batch size and pipeline "
                f"depth. Spread evenly through the table, most of those leases lie past the first {bound:,} "
                "events in claim order, so the gauges count them as pending. Rows marked sent but kept "
                "(`--keep-sent`) count as unsent until the table is next analysed.",
            ]
    built = [c for c in cases if c.get("index_build_seconds") is not None]
    if built:
        lines += [
            "",
            f"Migration 0003 (the dead-letter index) took {built[0]['index_build_seconds']:.1f} s on the "
            f"{built[0]['name']} table, blocking inserts meanwhile.",
        ]
    return "\n".join(lines)
