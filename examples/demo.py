"""``python -m examples.demo`` (``make demo``): the whole pipeline on one machine, checked.

With nothing configured it starts an embedded PostgreSQL and a Tansu broker,
migrates the outbox, runs ``outbox-relay run`` as a subprocess, lets a small
shop write orders and their events (some transactions rolled back), consumes
what reaches the broker, and reports what was lost, leaked, duplicated or
reordered. ``RELAY_DATABASE_URL`` (or ``DATABASE_URL``) and ``RELAY_SINK``
point it at servers of your own instead; an ``amqp://`` sink without
``?exchange=`` gets the topic exchange ``outbox-demo``. Exits 1 when an event
was lost, leaked or reordered, or the relay did not stop cleanly.

``DEMO_SOURCE=log`` runs it on the log source instead (``--source log --slot
demo``; the embedded PostgreSQL then starts with ``wal_level=logical``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import cast
from urllib.parse import parse_qsl, urlsplit

from devservers import Tansu, embedded_postgres, free_port
from devservers.interrupts import interrupts_deferred
from devservers.postgres import LOGICAL_DECODING
from examples.consumer import KafkaTap, RabbitTap
from examples.shop import Deliveries, Ledger, Report, Shop, percentile, summarize
from relay.cli import streams
from relay.config import DEFAULT_TABLE, AmqpSinkConfig, KafkaSinkConfig, parse_sink_url, redact_url
from relay.errors import ConfigError
from relay.sinks import sink_kind_name

logger = logging.getLogger(__name__)

DEMO_EXCHANGE = "outbox-demo"
DRAIN_TIMEOUT_SECONDS = 30.0
READY_TIMEOUT_SECONDS = 30.0
RELAY_STOP_TIMEOUT_SECONDS = 30.0
INTERRUPTED_STOP_SECONDS = 5.0
PROGRESS_INTERVAL_SECONDS = 1.0
SETTLE_SECONDS = 0.5
#: ``DEMO_SOURCE=log``: the relay reads PostgreSQL's logical decoding (docs/log-source.md).
SOURCE_FLAGS: tuple[str, ...] = ("--source", "log", "--slot", "demo") if os.environ.get("DEMO_SOURCE") == "log" else ()


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.demo",
        description="Run the shop, the relay and a consumer end to end and check what arrived.",
    )
    parser.add_argument("--orders", type=int, default=300, help="orders the shop places (default: 300)")
    parser.add_argument("--workers", type=int, default=4, help="shop threads writing at once (default: 4)")
    parser.add_argument(
        "--failure-rate", type=float, default=0.25, help="share of transactions rolled back (default: 0.25)"
    )
    parser.add_argument("--seed", type=int, help="random seed for a repeatable run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Default SIGTERM handling would skip the clean-up below and leave servers running.
    signal.signal(signal.SIGTERM, _interrupt)
    # Progress shows as it happens also through a pipe (`make demo | tee demo.log`).
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            ok = _demo(stack, args)
        streams.flush()
    except BrokenPipeError:
        # `python -m examples.demo | head -3`: the servers are stopped (the stack is closed); end quietly.
        streams.discard_output()
        return streams.BROKEN_PIPE_EXIT
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped", file=sys.stderr)
        return 130
    except (ConfigError, RuntimeError, TimeoutError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"{'OK' if ok else 'FAILED'} in {time.monotonic() - started:.1f}s", flush=True)
    except BrokenPipeError:
        streams.discard_output()
        return streams.BROKEN_PIPE_EXIT
    return 0 if ok else 1


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _demo(stack: contextlib.ExitStack, args: argparse.Namespace) -> bool:
    print(
        f"outbox-relay demo: {args.orders} orders, {args.workers} shop workers, "
        f"{args.failure_rate:.0%} of transactions rolled back"
    )
    sink = os.environ.get("RELAY_SINK")
    fresh_broker = not sink
    if sink:
        sink = _with_demo_exchange(sink)
        parse_sink_url(sink)  # a configuration mistake ends the demo before any server starts
    database_url = os.environ.get("RELAY_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if database_url:
        print(f"  database   {redact_url(database_url)} (from the environment)")
    else:
        database_url = stack.enter_context(embedded_postgres(LOGICAL_DECODING if SOURCE_FLAGS else None))
        print(f"  database   embedded PostgreSQL, {database_url}")
    if sink:
        print(f"  sink       {redact_url(sink)} (from the environment)")
    else:
        sink = f"kafka://{stack.enter_context(Tansu()).bootstrap}"
        print(f"  sink       Tansu (Kafka protocol), {sink}")
    sink_config = parse_sink_url(sink)
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="outbox-relay-demo-")))

    print(f"  migrate    {_relay_cli('migrate', '--database-url', database_url, *SOURCE_FLAGS)}")
    ledger, deliveries = Ledger(), Deliveries()
    # Consume before anything is published, so the consumer's start is no cut-off.
    kind = sink_kind_name(sink_config)
    if kind == "kafka":
        stack.enter_context(KafkaTap(cast(KafkaSinkConfig, sink_config), deliveries, from_start=fresh_broker))
    elif kind == "amqp":
        stack.enter_context(RabbitTap(cast(AmqpSinkConfig, sink_config), deliveries))
    else:
        raise SystemExit(f"demo: no read-back for a {kind} sink; use kafka:// or amqp://")
    relay = stack.enter_context(RelayProcess(database_url, sink, workdir / "relay.log"))
    print(f"  relay      pid {relay.pid}, ready on /readyz after {relay.wait_ready():.1f}s")

    table = os.environ.get("RELAY_TABLE", DEFAULT_TABLE)
    shop = Shop(
        database_url,
        ledger,
        orders=args.orders,
        workers=args.workers,
        failure_rate=args.failure_rate,
        table=table,
        seed=args.seed,
    )
    shop.prepare()
    stack.callback(shop.stop)
    shop.start()
    _watch(shop, ledger, deliveries)
    exit_code = relay.stop()
    # Whatever the relay published last (a duplicate, a leak) still gets time to arrive.
    time.sleep(SETTLE_SECONDS)
    report = summarize(ledger, deliveries)
    _print_report(report, exit_code)
    problems = relay.log_problems()
    if problems or exit_code != 0 or not report.ok:
        print(f"relay log ({len(problems)} warnings/errors), last lines:")
        for line in relay.log_tail():
            print(f"  | {line}")
    return report.ok and exit_code == 0


def _watch(shop: Shop, ledger: Ledger, deliveries: Deliveries) -> None:
    """Print progress once a second until the shop is done and the relay has caught up."""
    started = time.monotonic()
    drain_deadline: float | None = None
    while True:
        time.sleep(PROGRESS_INTERVAL_SECONDS)
        shop_done = shop.done()
        committed, rolled_back = ledger.counts()
        committed_keys = ledger.committed_keys()
        delivered = {key for key, _, _ in deliveries.snapshot()} & committed_keys
        missing = len(committed_keys - delivered)
        print(
            f"  {time.monotonic() - started:5.1f}s  written {committed + rolled_back:5d} "
            f"(rolled back {rolled_back:4d})  delivered {len(delivered):5d} of {committed:5d} committed"
            f"{'  [shop done]' if shop_done else ''}"
        )
        if not shop_done:
            continue
        if missing == 0:
            return
        drain_deadline = drain_deadline or time.monotonic() + DRAIN_TIMEOUT_SECONDS
        if time.monotonic() > drain_deadline:
            print(f"  gave up waiting: {missing} committed events not delivered")
            return


def _print_report(report: Report, relay_exit_code: int) -> None:
    written = report.committed + report.rolled_back
    share = report.rolled_back / written if written else 0.0
    p50, p99 = (percentile(report.latencies, q) * 1000 for q in (0.5, 0.99))
    rows = [
        ("events written", written, ""),
        ("  committed", report.committed, ""),
        ("  rolled back", report.rolled_back, f"({share:.0%})"),
        ("delivered", report.delivered, "unique idempotency keys"),
        ("duplicates", report.duplicates, "redelivered (at-least-once)"),
        ("leaked", report.leaked, "delivered but rolled back; must be 0"),
        ("lost", report.lost, "committed but not delivered; must be 0"),
        ("order violations", report.order_violations, "per key; must be 0"),
    ]
    if report.foreign or report.unreadable:
        rows.append(("ignored", report.foreign + report.unreadable, "from other runs, or unreadable"))
    print("report")
    for label, value, note in rows:
        print(f"  {label:<18}{value:>7}  {note}".rstrip())
    print(f"  {'latency p50/p99':<18}{p50:>7.1f} / {p99:.1f} ms  commit to consumer")
    print(f"  {'relay exit code':<18}{relay_exit_code:>7}  after SIGTERM; must be 0")


def _with_demo_exchange(sink: str) -> str:
    """``sink`` with ``?exchange=outbox-demo`` when it is AMQP and names no exchange.

    The default exchange routes by queue name only, so a consumer could not
    bind one queue to every topic the shop publishes.
    """
    try:
        parts = urlsplit(sink)
    except ValueError:
        return sink  # parse_sink_url reports it
    if parts.scheme.lower() not in ("amqp", "amqps"):
        return sink
    exchanges = [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if key == "exchange"]
    if exchanges and not exchanges[-1]:
        raise ConfigError("the demo needs a named exchange: drop ?exchange= or name one in RELAY_SINK")
    if exchanges:
        return sink
    return f"{sink}{'&' if parts.query else '?'}exchange={DEMO_EXCHANGE}"


def _relay_cli(*args: str) -> str:
    """Run an ``outbox-relay`` command as a user would; return its output."""
    result = subprocess.run(
        [sys.executable, "-m", "relay", *args], capture_output=True, text=True, check=False, timeout=120
    )
    if result.returncode != 0:
        raise RuntimeError(f"outbox-relay {args[0]} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout.strip()


class RelayProcess:
    """``outbox-relay run`` in a subprocess, its log in a file, stopped with SIGTERM."""

    def __init__(self, database_url: str, sink: str, log_path: Path) -> None:
        self.metrics_port = free_port()
        self.command = [
            sys.executable, "-m", "relay", "run", "--database-url", database_url, "--sink", sink, *SOURCE_FLAGS
        ]  # fmt: skip
        self.command += ["--metrics-port", str(self.metrics_port)]
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The relay's process id."""
        assert self._process is not None
        return self._process.pid

    def __enter__(self) -> RelayProcess:
        try:
            # An interrupt waits until the relay's id is known: then it can be stopped.
            with self.log_path.open("wb") as log, interrupts_deferred():
                # Its own session: a Ctrl-C at the terminal reaches the demo only,
                # which then stops the relay with SIGTERM, as an operator would.
                self._process = subprocess.Popen(
                    self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
        except BaseException:
            if self._process is not None:
                self.stop(INTERRUPTED_STOP_SECONDS)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if self._process is not None and self._process.poll() is None:
            # Interrupted, the broker may be gone already (a terminal's Ctrl-C reaches
            # Tansu too), so waiting out the publish timeout would only delay the exit.
            self.stop(RELAY_STOP_TIMEOUT_SECONDS if exc_type is None else INTERRUPTED_STOP_SECONDS)

    def wait_ready(self) -> float:
        """Wait for ``/readyz`` to answer 200; return the seconds it took."""
        assert self._process is not None
        started = time.monotonic()
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        while self._process.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - started > READY_TIMEOUT_SECONDS:
                raise TimeoutError(f"the relay was not ready after {READY_TIMEOUT_SECONDS:.0f}s")
            time.sleep(0.1)
        raise RuntimeError(f"the relay exited {self._process.returncode}: {' | '.join(self.log_tail(5))}")

    def stop(self, timeout: float = RELAY_STOP_TIMEOUT_SECONDS) -> int:
        """SIGTERM, then wait for a graceful exit; return the exit code (-9 if it had to be killed)."""
        assert self._process is not None
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            return -signal.SIGKILL

    def log_tail(self, lines: int = 15) -> list[str]:
        """The last lines the relay logged."""
        return self.log_path.read_text(errors="replace").splitlines()[-lines:]

    def log_problems(self) -> list[str]:
        """The relay's WARNING and ERROR lines."""
        return [
            line
            for line in self.log_path.read_text(errors="replace").splitlines()
            if " WARNING " in line or " ERROR " in line or "Traceback" in line
        ]


if __name__ == "__main__":
    sys.exit(main())
