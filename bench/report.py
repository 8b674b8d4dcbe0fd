"""Turn a run's results into ratios, target verdicts, a text table and docs/performance.md.

Pure functions of the results dictionary (the same one written to JSON), so
the smoke test can check them without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import mysql
from bench.stats import ratio

#: Issue 39's targets for the MySQL drains, as a share of L_steps_mysql in the same run (bench/mysql.py).
MYSQL_STEPS_TARGETS = {
    drain: (mysql.LABELS[drain], bound) for drain, bound in mysql.STEPS_TARGETS.items() if bound is not None
}


def dig(results: dict[str, Any], path: str) -> Any:
    """``results["a"]["b"]`` for ``"a.b"``; None where any step is missing."""
    value: Any = results
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def derive(results: dict[str, Any]) -> dict[str, float | None]:
    """The ratios the targets are stated in, from the raw figures."""
    r = results
    return {
        "s1_kafka_over_l_db": ratio(dig(r, "s1_kafka.rate"), dig(r, "baselines.l_db.rate")),
        "s1_kafka_over_l_kafka": ratio(dig(r, "s1_kafka.rate"), dig(r, "baselines.l_kafka.rate")),
        "s1_rmq_over_l_rmq": ratio(dig(r, "s1_rmq.rate"), dig(r, "baselines.l_rmq.rate")),
        "s1_rmq_over_l_db": ratio(dig(r, "s1_rmq.rate"), dig(r, "baselines.l_db.rate")),
        "ordered_over_unordered": ratio(dig(r, "s1_kafka.rate"), dig(r, "s1_kafka_unordered.rate")),
        "cloudevents_over_native": ratio(dig(r, "s1_kafka_cloudevents.rate"), dig(r, "s1_kafka.rate")),
        "structured_over_native": ratio(dig(r, "s1_kafka_cloudevents_structured.rate"), dig(r, "s1_kafka.rate")),
        "bytes_over_native": ratio(dig(r, "s1_kafka_bytes.rate"), dig(r, "s1_kafka.rate")),
        "debezium_over_native": ratio(dig(r, "s1_kafka_debezium.rate"), dig(r, "s1_kafka.rate")),
        "unordered_over_l_db": ratio(dig(r, "s1_kafka_unordered.rate"), dig(r, "baselines.l_db.rate")),
        "s3_kafka": dig(r, "s1_kafka.s3_ratio"),
        "s3_rmq": dig(r, "s1_rmq.s3_ratio"),
        "s2_throughput_over_offered": ratio(dig(r, "s2.notify.throughput"), dig(r, "s2.notify.offered_rate")),
        "s4_claim_ratio": dig(r, "s4.claim_ratio"),
        "s4_throughput_over_s2": ratio(dig(r, "s4.throughput_during"), dig(r, "s2.notify.throughput")),
        "s4_throughput_during_over_before": ratio(dig(r, "s4.throughput_during"), dig(r, "s4.throughput_before")),
        "publish_overhead_notify": dig(r, "writer_cost.publish_overhead_notify"),
        "publish_overhead_no_notify": dig(r, "writer_cost.publish_overhead_no_notify"),
        "publish_over_bare_insert": dig(r, "writer_cost.publish_over_bare_insert"),
        "mysql_keyed_over_l_db_mysql": dig(r, "mysql.keyed.ratio"),
        "mysql_null_keys_over_l_db_mysql": dig(r, "mysql.null_keys.ratio"),
        **{f"mysql_{drain}_over_l_steps_mysql": dig(r, f"mysql.{drain}.steps_ratio") for drain in MYSQL_STEPS_TARGETS},
        "l_steps_mysql_over_l_db_mysql": dig(r, "mysql.l_steps_ratio"),
    }


def _at_least(bound: float) -> Callable[[float], bool]:
    return lambda value: value >= bound


@dataclass(frozen=True)
class Target:
    """One target of the issue: what it says, where its figure is, and the test it must pass."""

    text: str
    path: str
    passes: Callable[[float], bool]
    shown: Callable[[float], str]


def _x(value: float) -> str:
    # Three significant digits, so a ratio just under a threshold does not print as on it.
    return f"{value:.3g}x"


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


TARGETS = (
    Target("Kafka S1 >= 0.9 x L_db", "ratios.s1_kafka_over_l_db", lambda v: v >= 0.9, _x),
    Target("Kafka S1 >= 30,000 events/s", "s1_kafka.rate", lambda v: v >= 30_000, lambda v: f"{v:,.0f}/s"),
    Target("RabbitMQ S1 >= 0.9 x L_rmq", "ratios.s1_rmq_over_l_rmq", lambda v: v >= 0.9, _x),
    Target("S2 commit-to-ack p50 <= 5 ms (NOTIFY on)", "s2.notify.ack_latency.p50_ms", lambda v: v <= 5, _ms),
    Target("S2 commit-to-ack p99 <= 25 ms (NOTIFY on)", "s2.notify.ack_latency.p99_ms", lambda v: v <= 25, _ms),
    Target("S3 late/early drain rate >= 0.9", "ratios.s3_kafka", lambda v: v >= 0.9, _x),
    Target("S4 claim time <= 2 x before", "s4.claim_ratio", lambda v: v <= 2, _x),
    Target(
        "S4 nothing lost (every committed event received)",
        "s4.not_received",
        lambda v: v == 0,
        lambda v: f"{v:.0f} not received",
    ),
    Target("publish() adds <= 10% (NOTIFY on)", "ratios.publish_overhead_notify", lambda v: v <= 0.1, "{:+.0%}".format),
    Target(
        "publish() <= 1.5 x a bare INSERT of the same columns",
        "ratios.publish_over_bare_insert",
        lambda v: v <= 1.5,
        _x,
    ),
    Target("relay's own latency p50 <= 3 ms", "relay_latency.difference.p50_ms", lambda v: v <= 3, _ms),
    Target("relay's own latency p99 <= 15 ms", "relay_latency.difference.p99_ms", lambda v: v <= 15, _ms),
    Target("relay peak RSS <= 150 MB", "s1_kafka.peak_rss_mb", lambda v: v <= 150, lambda v: f"{v:.0f} MB"),
    Target("ordered >= 0.8 x unordered", "ratios.ordered_over_unordered", lambda v: v >= 0.8, _x),
    Target("CloudEvents binary >= 0.9 x native (Kafka S1)", "ratios.cloudevents_over_native", lambda v: v >= 0.9, _x),
    Target(
        "CloudEvents structured >= 0.9 x native (Kafka S1)", "ratios.structured_over_native", lambda v: v >= 0.9, _x
    ),
    Target("bytes payloads >= 0.9 x native (Kafka S1)", "ratios.bytes_over_native", lambda v: v >= 0.9, _x),
    Target("Debezium table >= 0.9 x native (Kafka S1)", "ratios.debezium_over_native", lambda v: v >= 0.9, _x),
    Target(
        "MySQL Kafka drain, 5,000 keys >= 0.8 x L_db_mysql",
        "ratios.mysql_keyed_over_l_db_mysql",
        lambda v: v >= 0.8,
        _x,
    ),
    Target(
        "MySQL Kafka drain, null keys >= 0.8 x L_db_mysql",
        "ratios.mysql_null_keys_over_l_db_mysql",
        lambda v: v >= 0.8,
        _x,
    ),
    *(
        Target(
            f"MySQL Kafka drain, {name} >= {bound} x L_steps_mysql",
            f"ratios.mysql_{drain}_over_l_steps_mysql",
            _at_least(bound),
            _x,
        )
        for drain, (name, bound) in MYSQL_STEPS_TARGETS.items()
    ),
)


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its figure and whether it was met (None: not measured in this run)."""
    results = {**results, "ratios": derive(results)}
    verdicts = []
    for target in TARGETS:
        value = dig(results, target.path)
        measured = isinstance(value, int | float) and not math.isnan(value)
        verdicts.append(
            {
                "target": target.text,
                "value": value if measured else None,
                "shown": target.shown(value) if measured else "not run",
                "met": target.passes(value) if measured else None,
            }
        )
    return verdicts


def _rate(value: Any) -> str:
    return f"{value:,.0f}/s" if isinstance(value, int | float) and not math.isnan(value) else "-"


def _num(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return f"{value:{spec}}{suffix}"


def _repeats(rates: Any) -> str:
    if not isinstance(rates, list) or len(rates) < 2:
        return ""
    return f" (median of {', '.join(_rate(rate) for rate in rates)})"


def _missing(result: dict[str, Any]) -> str:
    text = f"{result.get('lost', 0)} lost"
    if result.get("undelivered"):
        text += f", {result['undelivered']} still in the outbox"
    return text


_CPU_GROUPS = (
    ("relay", "relay"),
    ("postgres", "PostgreSQL"),
    ("broker", "broker"),
    ("bench", "bench (client or consumer)"),
    ("kernel", "kernel threads"),
    ("other", "other"),
)


def _machine_cpu(entry: Any) -> tuple[str, str]:
    """(value, note) for a ``bench.cpu.per_event`` result: total per event, then by group."""
    if not entry:
        return "-", ""
    groups = entry["groups_us_per_event"]
    parts = ", ".join(f"{label} {groups[key]:.1f}" for key, label in _CPU_GROUPS if key in groups)
    note = f"{parts}; machine {entry['machine_busy_share']:.0%} busy, {entry['steal_share']:.0%} stolen"
    return f"{entry['machine_us_per_event']:.1f} us", note


def rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, ratio or note) for every figure the run produced."""
    r = results
    q = derive(r)
    out: list[tuple[str, str, str]] = []

    def add(name: str, value: str, note: str = "") -> None:
        if value not in ("-", ""):
            out.append((name, value, note))

    add("L_db  bare DELETE ... RETURNING loop", _rate(dig(r, "baselines.l_db.rate")), "baseline")
    add("L_kafka  raw confluent-kafka produce", _rate(dig(r, "baselines.l_kafka.rate")), "baseline")
    add("L_rmq  raw pika, confirms, persistent", _rate(dig(r, "baselines.l_rmq.rate")), "baseline")
    add("L_commit  one-row business tx, 1 conn", _rate(dig(r, "writer_cost.rates.plain")), "baseline")
    add("L_db_mysql  bare SKIP LOCKED + DELETE loop", _rate(dig(r, "mysql.l_db_mysql")), "baseline (MySQL)")
    for key, name in (("keyed", "5,000 keys"), ("null_keys", "null keys")):
        add(
            f"MySQL Kafka drain ({name})",
            _rate(dig(r, f"mysql.{key}.rows_per_second")),
            f"{_num(dig(r, f'mysql.{key}.ratio'))} x L_db_mysql; mean claim "
            f"{_num(dig(r, f'mysql.{key}.mean_claim_ms'), '.0f', ' ms')}",
        )
    floor = dig(r, "baselines.l_latency")
    if floor:
        add(
            "L_latency  raw produce-to-consume p50/p99",
            f"{_num(floor['to_consume']['p50_ms'], '.1f')}/{_num(floor['to_consume']['p99_ms'], '.1f')} ms",
            f"at {_rate(floor['rate'])}; produce-to-ack p50/p99 "
            f"{_num(floor['to_ack']['p50_ms'], '.1f')}/{_num(floor['to_ack']['p99_ms'], '.1f')} ms",
        )
    for key, name in (("s1_kafka", "S1 Kafka (keyed)"), ("s1_kafka_unordered", "S1 Kafka (null keys)")):
        add(
            f"{name}  10%-90%",
            _rate(dig(r, f"{key}.rate")),
            f"{_num(ratio(dig(r, f'{key}.rate'), dig(r, 'baselines.l_db.rate')))} x L_db, "
            f"{_num(ratio(dig(r, f'{key}.rate'), dig(r, 'baselines.l_kafka.rate')))} x L_kafka"
            + _repeats(dig(r, f"{key}.repeats")),
        )
    add(
        "S1 RabbitMQ  10%-90%",
        _rate(dig(r, "s1_rmq.rate")),
        f"{_num(q['s1_rmq_over_l_rmq'])} x L_rmq" + _repeats(dig(r, "s1_rmq.repeats")),
    )
    add("ordered / unordered (Kafka S1)", _num(q["ordered_over_unordered"], ".2f", "x"))
    for key, name, share in (
        ("s1_kafka_cloudevents", "CloudEvents binary", "cloudevents_over_native"),
        ("s1_kafka_cloudevents_structured", "CloudEvents structured", "structured_over_native"),
        ("s1_kafka_bytes", "bytes payloads", "bytes_over_native"),
        ("s1_kafka_debezium", "Debezium table", "debezium_over_native"),
    ):
        add(
            f"S1 Kafka (keyed, {name})  10%-90%",
            _rate(dig(r, f"{key}.rate")),
            f"{_num(q[share])} x the native keyed drain" + _repeats(dig(r, f"{key}.repeats")),
        )
    for key, name in (("s1_kafka", "Kafka"), ("s1_kafka_unordered", "Kafka null keys"), ("s1_rmq", "RabbitMQ")):
        add(
            f"S3 {name}: rate 80-90% / 10-20%",
            _num(dig(r, f"{key}.s3_ratio"), ".2f", "x"),
            f"{_rate(dig(r, f'{key}.rate_80_90'))} vs {_rate(dig(r, f'{key}.rate_10_20'))}",
        )
        add(
            f"relay CPU per 1,000 events ({name})",
            _num(dig(r, f"{key}.cpu_seconds_per_1000"), ".3f", " s"),
            f"{_num(dig(r, f'{key}.cpu_share_of_one_core'), '.0%')} of a core while draining",
        )
        add(f"relay peak RSS ({name})", _num(dig(r, f"{key}.peak_rss_mb"), ".0f", " MB"))
        add(f"machine CPU per event ({name})", *_machine_cpu(dig(r, f"{key}.machine_cpu")))
    runs = dig(r, "baselines.l_db.runs") or []
    if runs:
        add("machine CPU per event (L_db, last run)", *_machine_cpu(runs[-1].get("cpu")))
    for mode in ("notify", "no_notify"):
        s2 = dig(r, f"s2.{mode}")
        if not s2:
            continue
        label = "NOTIFY on" if mode == "notify" else "NOTIFY off, --no-listen"
        lat = s2["latency"]
        ack = s2.get("ack_latency")
        if ack:
            add(
                f"S2 {label}: commit-to-ack p50/p99/p99.9",
                f"{_num(ack['p50_ms'], '.1f')}/{_num(ack['p99_ms'], '.1f')}/{_num(ack['p999_ms'], '.1f')} ms",
                "writer's COMMIT returning to the broker's ack reaching the relay",
            )
        for leg, name, note in (
            ("claim_latency", "commit-to-claimed", "the database leg: COMMIT to the claim returning the event"),
            ("claim_to_ack", "claimed-to-ack", "the broker leg: claim returned to the broker's ack, per event"),
        ):
            part = s2.get(leg)
            if part:
                add(
                    f"S2 {label}: {name} p50/p99/p99.9",
                    f"{_num(part['p50_ms'], '.1f')}/{_num(part['p99_ms'], '.1f')}/{_num(part['p999_ms'], '.1f')} ms",
                    note,
                )
        add(
            f"S2 {label}: commit-to-consume p50/p99/p99.9",
            f"{_num(lat['p50_ms'], '.1f')}/{_num(lat['p99_ms'], '.1f')}/{_num(lat['p999_ms'], '.1f')} ms",
            f"{_rate(s2['achieved_rate'])} offered of {_rate(s2['offered_rate'])}, {_missing(s2)}",
        )
        add(
            f"S2 {label}: relay insert-to-ack p50/p99",
            f"{_num(s2.get('insert_to_ack_p50_ms'), '.1f')}/{_num(s2.get('insert_to_ack_p99_ms'), '.1f')} ms",
            "the relay's publish-latency histogram, bucket-interpolated",
        )
    own = dig(r, "relay_latency.difference")
    if own:
        add(
            "relay's own latency p50/p99",
            f"{_num(own['p50_ms'], '+.1f')}/{_num(own['p99_ms'], '+.1f')} ms",
            f"commit-to-consume minus the raw client's produce-to-consume at {_rate(dig(r, 'relay_latency.rate'))}",
        )
    s4 = dig(r, "s4")
    if s4:
        add(
            "S4 claim mean before -> during long tx",
            f"{_num(s4['claim_mean_ms_before'], '.2f')} -> {_num(s4['claim_mean_ms_during'], '.2f')} ms",
            f"{_num(s4['claim_ratio'], '.2f')}x (last 10 s: {_num(s4['claim_ratio_last_10s'], '.2f')}x)",
        )
        add(
            "S4 throughput during long tx",
            _rate(s4["throughput_during"]),
            f"{_num(q['s4_throughput_over_s2'])} x S2, {_num(q['s4_throughput_during_over_before'])} x before",
        )
        add(
            "S4 n_dead_tup before -> end of hold",
            f"{_num(s4['n_dead_tup_before'], ',.0f')} -> {_num(s4['n_dead_tup_during'], ',.0f')}",
            f"{_missing(s4)}, {s4['duplicates']} duplicates",
        )
    cost = dig(r, "writer_cost.rates")
    if cost:
        add(
            "writer: business tx + publish(), NOTIFY on",
            _rate(cost["publish_notify"]),
            f"{_num(q['publish_overhead_notify'], '+.0%')} time per tx vs L_commit",
        )
        add(
            "writer: business tx + publish(), NOTIFY off",
            _rate(cost["publish_no_notify"]),
            f"{_num(q['publish_overhead_no_notify'], '+.0%')} time per tx vs L_commit",
        )
        add(
            "writer: business tx + bare INSERT, plain table",
            _rate(cost.get("bare_insert")),
            f"{_num(dig(r, 'writer_cost.bare_insert_overhead'), '+.0%')} time per tx vs L_commit; publish() adds "
            f"{_num(q['publish_over_bare_insert'], '.2f', 'x')} what it adds",
        )
    return out


def format_table(results: dict[str, Any]) -> str:
    """The figures and the target verdicts as aligned plain text."""
    figures = rows(results)
    width = max((len(name) for name, _, _ in figures), default=10)
    value_width = max((len(value) for _, value, _ in figures), default=10)
    lines = [f"{name:<{width}}  {value:>{value_width}}  {note}".rstrip() for name, value, note in figures]
    lines.append("")
    for verdict in evaluate(results):
        mark = {True: "met", False: "MISSED", None: "-"}[verdict["met"]]
        lines.append(f"{verdict['target']:<{width}}  {verdict['shown']:>{value_width}}  {mark}")
    return "\n".join(lines)
