"""``python -m bench``: run the scenarios, print the table, write JSON and docs/performance.md.

python -m bench                               # the default run (10 to 25 minutes; keys' cut cases the most)
python -m bench --only s1 --events 50000      # iterate on the drain rate in ~1 minute
python -m bench --long                        # 1M events, 60 s steady, 10 min long transaction
python -m bench --only gauges                 # status vs the relay's gauges on big tables; updates its section
python -m bench --only keys                   # key distributions (issue 16); updates its section
python -m bench --only keys --keys-events 5000 --keys-seconds 20   # the same, small, in ~2 minutes
python -m bench --only mysql                  # the Kafka drain on MySQL/MariaDB vs L_db_mysql (issue 17), ~1 minute
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from bench import docs, gauges, keys, keys_report, latency, mysql, report
from bench.runner import Run
from bench.services import machine, require_postgres

RESULTS_DIR = Path(__file__).parent / "results"
DOC_PATH = docs.PAGE_PATH
SCENARIOS = {
    "s1": "S1 Kafka keyed drain + S3 + relay cost, with L_db and L_kafka",
    "s1u": "S1 Kafka drain with null keys (the unordered path)",
    "s1ce": "S1 Kafka keyed drain in CloudEvents binary and structured mode, each beside a native one",
    "s1bd": "S1 Kafka keyed drain with bytes payloads and from a Debezium table, each beside a native one",
    "rmq": "S1 RabbitMQ drain, with L_rmq",
    "s2": "S2 steady load, NOTIFY on and off",
    "s4": "S4 steady load beside a long REPEATABLE READ transaction",
    "writer": "writer cost: business tx with and without publish(), NOTIFY on/off, vs a bare INSERT (L_commit)",
    "keys": "key distributions: null, one per event, 1,000, 8 and 1 key(s), to Kafka and RabbitMQ, vs L_db and L_rmq",
    "latency": "the relay's own latency: S2 commit-to-consume minus the raw client's, at 500 events/s",
    "mysql": (
        "the Kafka drain on MySQL/MariaDB over 5,000, 1,000 and 8 keys, a key per event and null keys, "
        "vs L_db_mysql and L_steps_mysql (issues 17, 39)"
    ),
    "profile": "where S1 Kafka's time goes (py-spy, phase timers, EXPLAIN ANALYZE); not in the default set",
    "gauges": "status() vs the relay's gauges() on 100k and 1M unsent events (3M with --long); not in the default set",
}
DEFAULT = ("s1", "s1u", "s1ce", "s1bd", "rmq", "s2", "s4", "writer", "keys", "latency", "mysql")
#: The page sections a partial run rewrites, by the scenario that feeds them alone.
OWN_SECTIONS = {
    "gauges": "gauges",
    "keys": "keys",
    "latency": "relay-latency",
    "writer": "publish-cost",
    "mysql": "mysql",
}
EVENTS, LONG_EVENTS = 200_000, 1_000_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the relay against real PostgreSQL, Tansu and RabbitMQ.",
        epilog="scenarios: " + "; ".join(f"{name}: {text}" for name, text in SCENARIOS.items()),
    )
    parser.add_argument("--only", help=f"comma-separated scenarios (default: {','.join(DEFAULT)})")
    parser.add_argument("--events", type=int, help=f"events per drain (default {EVENTS:,}; --long {LONG_EVENTS:,})")
    parser.add_argument("--long", action="store_true", help="1M events, 60 s steady runs, 10 min long transaction")
    parser.add_argument("--s2-seconds", type=float, help="length of each S2 run (default 20; --long 60)")
    parser.add_argument("--s4-seconds", type=float, help="how long S4 holds its transaction (default 60; --long 600)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each drain (s1, s1u, rmq) this many times; the median-rate run is reported",
    )
    parser.add_argument(
        "--keys-events",
        type=int,
        default=keys.EVENTS,
        help=f"events per key-distribution case (default {keys.EVENTS:,})",
    )
    parser.add_argument(
        "--keys-seconds",
        type=float,
        default=keys.CAP_SECONDS,
        help=f"cut a key-distribution case after this long (default {keys.CAP_SECONDS:.0f})",
    )
    parser.add_argument(
        "--mysql-events",
        type=int,
        default=mysql.EVENTS,
        help=f"events per drain of the mysql scenario (default {mysql.EVENTS:,}, the issue's)",
    )
    parser.add_argument("--rate", type=float, help="S2/S4 offered events/s (default: half the S1 Kafka rate)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json", help="results JSON")
    parser.add_argument(
        "--write-doc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite docs/performance.md (default: only after a full default run; a run with gauges "
        "rewrites that section alone, and so do keys, latency and writer)",
    )
    parser.add_argument(
        "--doc-from",
        type=Path,
        metavar="JSON",
        help="only rewrite docs/performance.md from a saved results file (and the last profile), then exit",
    )
    args = parser.parse_args(argv)
    chosen = tuple(name.strip() for name in (args.only or ",".join(DEFAULT)).split(",") if name.strip())
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    args.scenarios = chosen
    args.events = args.events or (LONG_EVENTS if args.long else EVENTS)
    args.s2_seconds = args.s2_seconds or (60.0 if args.long else 20.0)
    args.s4_seconds = args.s4_seconds or (600.0 if args.long else 60.0)
    # Without --write-doc or --no-write-doc, a partial run still rewrites the
    # sections of the page that only its scenarios feed.
    args.update_sections = args.write_doc is None
    if args.write_doc is None:
        args.write_doc = set(DEFAULT) <= set(chosen) and args.events >= EVENTS
    return args


def _clean(value: Any) -> Any:
    """NaN is not JSON: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.doc_from:
        DOC_PATH.write_text(docs.render(json.loads(args.doc_from.read_text()), DOC_PATH.read_text()))
        print(f"rewrote {DOC_PATH} from {args.doc_from}")
        return 0
    require_postgres()
    started = time.monotonic()

    def progress(message: str) -> None:
        elapsed = time.monotonic() - started
        print(f"[{int(elapsed // 60):02d}:{elapsed % 60:04.1f}] {message}", flush=True)

    previous: dict[str, Any] = {}
    if args.output.exists():
        try:
            previous = json.loads(args.output.read_text())
        except ValueError:
            previous = {}
    results_holder: dict[str, Any] = {}

    def save() -> None:
        results = results_holder["run"].results
        results["ratios"] = report.derive(results)
        results["targets"] = report.evaluate(results)
        results["seconds"] = time.monotonic() - started
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(_clean(results), indent=2, default=str) + "\n")

    run = Run(events=args.events, progress=progress, save=save, repeat=max(1, args.repeat))
    results_holder["run"] = run
    run.results["config"] = {
        "scenarios": list(args.scenarios),
        "events": args.events,
        "repeat": args.repeat,
        "long": args.long,
        "s2_seconds": args.s2_seconds,
        "s4_seconds": args.s4_seconds,
        "keys_events": args.keys_events,
        "keys_seconds": args.keys_seconds,
        "mysql_events": args.mysql_events,
        "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
    }
    run.results["machine"] = machine()
    progress(f"run {run.cleanup.run}: {', '.join(args.scenarios)} with {args.events:,} events")
    try:
        chosen = set(args.scenarios)
        if "s1" in chosen:
            run.attempt("s1", lambda: run.s1(with_unordered="s1u" in chosen, with_formats="s1ce" in chosen))
        else:
            if "s1u" in chosen:
                run.attempt("s1u", run.s1_unordered)
            if "s1ce" in chosen:
                run.attempt("s1ce", run.s1_formats)
        if "s1bd" in chosen:
            run.attempt("s1bd", run.s1_layouts)
        if "rmq" in chosen:
            run.attempt("rmq", run.s1_rabbitmq)
        if "s2" in chosen:
            run.attempt("s2", lambda: run.s2(run.steady_rate(args.rate, previous), args.s2_seconds))
        if "s4" in chosen:
            run.attempt("s4", lambda: run.s4(run.steady_rate(args.rate, previous), args.s4_seconds))
        if "writer" in chosen:
            run.attempt("writer", run.writer_cost)
        if "profile" in chosen:
            from bench.profile import profile

            run.attempt("profile", lambda: profile(run))
        if "gauges" in chosen:
            run.attempt("gauges", lambda: gauges.measure(run, long=args.long))
        if "keys" in chosen:
            run.attempt("keys", lambda: keys.measure(run, events=args.keys_events, cap_seconds=args.keys_seconds))
        if "latency" in chosen:
            run.attempt("latency", lambda: latency.measure(run, seconds=args.s2_seconds))
        if "mysql" in chosen:
            run.attempt("mysql", lambda: mysql.scenario(run, events=args.mysql_events))
    finally:
        run.close()
        save()
    results = run.results
    print()
    print(report.format_table(results))
    if "profile" in results:
        print()
        print(docs.profile_text(results["profile"]))
    if "gauges" in results and "gauges" not in results["errors"]:
        print()
        print(docs.gauges_text(results["gauges"]))
    if "keys" in results:
        print()
        print(keys_report.keys_text(results["keys"]))
    if "mysql" in results:
        print()
        print(mysql.mysql_text(results["mysql"]))
    print(f"\nresults: {args.output}")
    if args.write_doc:
        DOC_PATH.write_text(docs.render(results, DOC_PATH.read_text()))
        print(f"rewrote {DOC_PATH}")
    elif args.update_sections and DOC_PATH.exists():
        texts = docs.sections(results)
        own = {
            section: texts[section]
            for scenario, section in OWN_SECTIONS.items()
            if scenario in args.scenarios and scenario not in results["errors"]
        }
        if own:
            DOC_PATH.write_text(docs.fill(DOC_PATH.read_text(), own))
            print(f"rewrote the {', '.join(own)} section(s) of {DOC_PATH}")
    if results["errors"]:
        print(f"scenarios that failed: {', '.join(results['errors'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
