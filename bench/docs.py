"""docs/performance.md, rendered from one run's results (and the last profile, if any)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench import report

PROFILE_PATH = Path(__file__).parent / "results" / "profile.json"

METHOD = """\
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
- **L_rmq**: pika with pipelined publisher confirms (at most 2,000
  unconfirmed, what two relay batches hold), persistent and mandatory, to a
  durable queue on the default exchange, until every confirm is in.
- **L_commit**: back-to-back one-row business transactions (`INSERT INTO
  business`) on one connection.
- **L_latency**: the broker's own latency floor at S2's rate: a raw
  confluent-kafka producer (the relay's settings, so `linger.ms` 5) sending
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
  unordered path.
- **S3 backlog**: in S1, the rate between 80% and 90% received over the rate
  between 10% and 20%: does the claim slow down as the front of the table
  fills with dead rows?
- **S2 steady**: writers offer a fixed rate by the wall clock (open loop,
  several connections), each event a one-row business transaction plus
  `producers.publish`. The rate is half the S1 Kafka rate, capped at half of
  what the writers reach flat out on this machine (the writers share its two
  cores with PostgreSQL, the relay and the broker). Latency is
  **commit-to-consume**: from the writer's COMMIT returning to the consumer
  fetching the message, an upper bound on the relay's commit-to-ack (it adds
  the broker's hand-over to the consumer). The first 10% of each run is
  warm-up and left out. The relay's own view, from the row's `created_at`
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
