"""One benchmark run: the servers, the seeded templates, and each scenario with its baselines.

Scenarios share what they can (a seeded template is built once, on first
use) and record their figures into one results dictionary as they finish,
so an error in one scenario leaves the others' figures intact.
"""

from __future__ import annotations

import math
import multiprocessing
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from bench import baselines, stats
from bench.consumers import KafkaReceiver, RabbitReceiver
from bench.drain import Drain, run_drain
from bench.services import AMQP_URL, KAFKA_PARTITIONS, Cleanup, prepare_template, require_rabbitmq
from bench.steady import Steady, run_long_transaction, run_steady, writer_capacity
from bench.writers import commit_costs
from devservers import Tansu

#: Offer S2's load at this share of the S1 Kafka rate...
S2_SHARE_OF_S1 = 0.5
#: ...but never above this share of what the writers reach flat out on this machine.
S2_SHARE_OF_WRITER_CAPACITY = 0.5
S2_FALLBACK_RATE = 1000.0
WRITER_COST_SECONDS = 30.0
L_LATENCY_SECONDS = 10.0
BASELINE_RECEIVE_TIMEOUT_SECONDS = 120.0
#: The short topic name of each template's events (the queue has the same name).
_TOPICS = {"seed": "s1", "seedu": "s1u", "empty": "steady"}
#: The drains of scenario s1ce: results key -> the sink URL's format= (issue 18).
FORMAT_DRAINS = {"s1_kafka_cloudevents": "cloudevents", "s1_kafka_cloudevents_structured": "cloudevents-structured"}


def in_child_process(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run a broker baseline in its own process, as the relay runs in its own.

    In this process it would share the interpreter lock with the consumer
    thread that counts its messages, and be slower than the relay for it.
    """
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


class Run:
    """Holds the servers and templates of one run and the results so far."""

    def __init__(
        self, *, events: int, progress: Callable[[str], None], save: Callable[[], None], repeat: int = 1
    ) -> None:
        self.events = events
        self.repeat = repeat
        self.progress = progress
        self.save = save
        self.tansu: Tansu | None = None
        self.cleanup = Cleanup(lambda: self.tansu.bootstrap if self.tansu else None)
        self.results: dict[str, Any] = {"baselines": {}, "errors": {}}
        self._templates: dict[str, str] = {}
        self._drains: dict[str, list[dict[str, Any]]] = {}

    # -- plumbing ----------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        if self.tansu is None:
            self.progress("starting Tansu (Kafka protocol, in memory)")
            self.tansu = Tansu().start()
        return self.tansu.bootstrap

    def close(self) -> None:
        for problem in self.cleanup.close():
            self.progress(f"cleanup: {problem}")
        if self.tansu is not None:
            self.tansu.stop()
            self.tansu = None

    def template(self, name: str) -> str:
        """Build the template ``name`` (seed: keyed events, seedu: null keys, empty) once."""
        if name not in self._templates:
            started = time.monotonic()
            events = 0 if name == "empty" else self.events
            self.progress(f"seeding template {name}: {events:,} events")
            prepare_template(self.cleanup, name, events=events, topic=self.topic(name), keyed=name == "seed")
            self.progress(f"seeded {name} in {time.monotonic() - started:.1f}s")
            self._templates[name] = name
        return self._templates[name]

    def topic(self, template: str) -> str:
        """The topic (and queue) name the template's events carry."""
        return self.cleanup.topic_name(_TOPICS[template])

    def attempt(self, name: str, work: Callable[[], None]) -> None:
        """Run one scenario; record its error instead of stopping the run."""
        started = time.monotonic()
        self.progress(f"== {name}")
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - one failed scenario must not lose the others' figures
            self.results["errors"][name] = f"{type(exc).__name__}: {exc}"
            self.progress(f"{name} FAILED: {exc}")
            traceback.print_exc()
        self.progress(f"{name} took {time.monotonic() - started:.0f}s")
        self.save()

    # -- baselines ---------------------------------------------------------

    def _bracket(self, name: str, result: dict[str, Any]) -> None:
        """Record one measurement of a baseline; its rate is the mean of those taken around the scenario.

        Each broker and database baseline is taken before and after the
        scenario it is the denominator of, so a machine that got busier (or
        quieter) in between moves both sides of the ratio alike.
        """
        entry = self.results["baselines"].setdefault(name, {"runs": []})
        entry["runs"].append(result)
        rates = [run["rate"] for run in entry["runs"]]
        entry["rate"] = sum(rates) / len(rates)
        self.progress(
            f"{name.replace('l_', 'L_', 1)}: {result['rate']:,.0f} events/s (mean so far {entry['rate']:,.0f})"
        )

    def l_db(self) -> None:
        url = self.cleanup.create_database("ldb", template=self.template("seed"))
        try:
            result = baselines.l_db(url, self.events)
        finally:
            self.cleanup.drop_database("ldb")
        self._bracket("l_db", result)

    def l_kafka(self) -> None:
        bootstrap = self.bootstrap
        topic = self.cleanup.create_topic("lkafka")
        receiver = KafkaReceiver(bootstrap, topic, KAFKA_PARTITIONS)
        try:
            result = self.received_baseline(receiver, baselines.l_kafka, bootstrap, topic)
        finally:
            self.cleanup.delete_topic(topic)
        self._bracket("l_kafka", result)

    def l_rmq(self) -> None:
        require_rabbitmq()
        queue = self.cleanup.create_queue("lrmq")
        receiver = RabbitReceiver(AMQP_URL, queue)
        try:
            result = self.received_baseline(receiver, baselines.l_rmq, AMQP_URL, queue)
        finally:
            self.cleanup.delete_queue(queue)
        self._bracket("l_rmq", result)

    def received_baseline(
        self,
        receiver: KafkaReceiver | RabbitReceiver,
        baseline: Callable[..., dict[str, Any]],
        *args: Any,
        events: int | None = None,
    ) -> dict[str, Any]:
        """Run ``baseline(*args, events)`` in a child process with ``receiver`` reading alongside.

        ``events`` defaults to the run's events per drain.
        """
        events = events or self.events
        receiver.start()
        receiver.ready.wait(30)
        try:
            result = in_child_process(baseline, *args, events)
            receiver.wait_for(events, BASELINE_RECEIVE_TIMEOUT_SECONDS)
            result["consumer_rate"] = stats.window_rate(receiver.marks, events, 0.1, 0.9)
        finally:
            receiver.stop()
        return result

    # -- scenarios ---------------------------------------------------------

    def _record_drain(self, key: str, result: dict[str, Any]) -> None:
        """Keep every repeat of a drain; the one with the median rate stands for them."""
        runs = self._drains.setdefault(key, [])
        runs.append(result)
        ordered = sorted(runs, key=lambda run: run["rate"] if not math.isnan(run["rate"]) else 0.0)
        self.results[key] = {**ordered[(len(ordered) - 1) // 2], "repeats": [run["rate"] for run in runs]}
        self.progress(f"{key}: {result['rate']:,.0f} events/s, S3 {result['s3_ratio'] or math.nan:.2f}")

    def _kafka_drain(self, key: str, template: str, *extra: str, sink_format: str = "native") -> None:
        bootstrap = self.bootstrap
        topic = self.cleanup.create_topic(_TOPICS[template])
        drain = Drain(self.cleanup, self.template(template), topic, self.events, "kafka", bootstrap, self.progress)
        drain.format = sink_format
        try:
            result = run_drain(drain, key, *extra)
        finally:
            self.cleanup.delete_topic(topic)
        self._record_drain(key, result)

    def s1(self, *, with_unordered: bool = False, with_formats: bool = False) -> None:
        """S1 Kafka with keys (plus S3 and the relay's cost), between its two baselines.

        ``with_unordered`` runs the null-key drain right after each keyed one,
        so the ordered/unordered ratio compares drains moments apart rather
        than a minute or more, which on this machine can be 2x of noise.
        ``with_formats`` does the same with the CloudEvents drains.
        """
        self.l_db()
        self.l_kafka()
        for _ in range(self.repeat):
            self._kafka_drain("s1_kafka", "seed")
            if with_unordered:
                self._kafka_drain("s1_kafka_unordered", "seedu")
            if with_formats:
                self._format_drains()
            self.l_kafka()
            self.l_db()

    def s1_formats(self) -> None:
        """The keyed S1 Kafka drain natively and in each CloudEvents mode, moments apart.

        With ``--repeat``, every other round runs the CloudEvents drains first,
        so neither side always has the first drain of the run (a cold broker).
        """
        for turn in range(self.repeat):
            if turn % 2:
                self._format_drains()
            self._kafka_drain("s1_kafka", "seed")
            if not turn % 2:
                self._format_drains()

    def _format_drains(self) -> None:
        for key, sink_format in FORMAT_DRAINS.items():
            self._kafka_drain(key, "seed", sink_format=sink_format)

    def s1_unordered(self) -> None:
        """S1 Kafka with every key null: the unordered fast path."""
        for _ in range(self.repeat):
            self._kafka_drain("s1_kafka_unordered", "seedu")

    def s1_rabbitmq(self) -> None:
        """S1 through RabbitMQ (default exchange, queue named after the topic), between two L_rmq."""
        self.l_rmq()
        for _ in range(self.repeat):
            template = self.template("seed")
            queue = self.cleanup.create_queue(_TOPICS[template])
            drain = Drain(self.cleanup, template, queue, self.events, "rabbitmq", None, self.progress)
            try:
                result = run_drain(drain, "s1_rmq")
            finally:
                self.cleanup.delete_queue(queue)
            self._record_drain("s1_rmq", result)
            self.l_rmq()

    def steady_rate(self, override: float | None, previous: dict[str, Any]) -> float:
        """S2's offered rate: half the S1 Kafka rate, capped at half the writers' flat-out rate."""
        if "s2_rate" in self.results:
            return float(self.results["s2_rate"]["rate"])
        s1 = self.results.get("s1_kafka", {}).get("rate") or previous.get("s1_kafka", {}).get("rate")
        basis = "this run's S1" if self.results.get("s1_kafka") else "the previous run's S1"
        url = self.cleanup.create_database("capacity", template=self.template("empty"))
        try:
            capacity = writer_capacity(url, self.topic("empty"))
        finally:
            self.cleanup.drop_database("capacity")
        if override:
            rate, why = override, "--rate"
        elif s1 and not math.isnan(s1):
            wanted = S2_SHARE_OF_S1 * s1
            cap = S2_SHARE_OF_WRITER_CAPACITY * capacity
            rate, why = min(wanted, cap), f"50% of {basis}" if wanted <= cap else "50% of writer capacity"
        else:
            rate, why = min(S2_FALLBACK_RATE, S2_SHARE_OF_WRITER_CAPACITY * capacity), "no S1 figure: fallback"
        self.results["s2_rate"] = {"rate": rate, "why": why, "s1_rate": s1, "writer_capacity": capacity}
        self.progress(f"S2 load: {rate:,.0f} events/s ({why}; writers reach {capacity:,.0f}/s flat out)")
        return rate

    def raw_latency(self, rate: float, seconds: float) -> dict[str, Any]:
        """The broker's latency floor at ``rate``: raw producer to ack and to S2's kind of consumer."""
        bootstrap = self.bootstrap
        topic = self.cleanup.create_topic("llatency")
        receiver = KafkaReceiver(bootstrap, topic, KAFKA_PARTITIONS, keys=True)
        receiver.start()
        receiver.ready.wait(30)
        try:
            return baselines.l_latency(bootstrap, topic, rate, seconds, receiver)
        finally:
            receiver.stop()
            self.cleanup.delete_topic(topic)

    def l_latency(self, rate: float, seconds: float) -> None:
        """L_latency: :meth:`raw_latency` at S2's rate."""
        self.results["baselines"]["l_latency"] = result = self.raw_latency(rate, seconds)
        self.progress(
            f"L_latency at {rate:,.0f}/s: produce-to-consume p50 {result['to_consume']['p50_ms']:.1f} ms, "
            f"p99 {result['to_consume']['p99_ms']:.1f} ms; produce-to-ack p50 {result['to_ack']['p50_ms']:.1f} ms"
        )

    def s2(self, rate: float, seconds: float) -> None:
        self.l_latency(rate, min(L_LATENCY_SECONDS, seconds))
        steady = Steady(self.cleanup, self.template("empty"), self.bootstrap, rate, self.progress)
        results: dict[str, Any] = {}
        self.results["s2"] = results
        for notify in (True, False):
            key = "notify" if notify else "no_notify"
            results[key] = result = run_steady(steady, f"s2_{key}", seconds, notify=notify)
            lat = result["latency"]
            self.progress(
                f"S2 {key}: p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, "
                f"p99.9 {lat['p999_ms']:.1f} ms, {result['lost']} lost"
            )

    def s4(self, rate: float, hold_seconds: float) -> None:
        steady = Steady(self.cleanup, self.template("empty"), self.bootstrap, rate, self.progress)
        self.results["s4"] = result = run_long_transaction(steady, "s4", hold_seconds)
        self.progress(
            f"S4: claim {result['claim_mean_ms_before']:.2f} -> {result['claim_mean_ms_during']:.2f} ms, "
            f"n_dead_tup {result['n_dead_tup_during']:,}, {result['lost']} lost"
        )

    def writer_cost(self) -> None:
        url = self.cleanup.create_database("writer", template=self.template("empty"))
        try:
            self.results["writer_cost"] = result = commit_costs(
                url, self.topic("empty"), seconds=WRITER_COST_SECONDS, progress=self.progress
            )
        finally:
            self.cleanup.drop_database("writer")
        self.results["baselines"]["l_commit"] = {"rate": result["rates"]["plain"]}
