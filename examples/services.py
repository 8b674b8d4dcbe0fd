"""``python -m examples.services shop|consumer``: the example services of ``compose/``.

``shop`` places orders without end at a modest rate with the demo's shop
(:class:`examples.shop.Shop`): every step of an order is one transaction that
changes the order row and writes its event with ``producers.publish``, and
some are rolled back. ``consumer`` reads the shop's topic from Kafka in a
consumer group and records each event once through the ``consumers`` inbox
(:class:`examples.consumer.InboxConsumer`), logging what it processed.

The environment is read here and nowhere else: every flag of ``shop`` falls
back to ``SHOP_<FLAG>``, every flag of ``consumer`` to ``CONSUMER_<FLAG>``,
and ``--database-url`` of both also to ``DATABASE_URL``. Both stop on SIGTERM
or SIGINT after the transaction in hand and exit 0. Any other end is an error:
one line on stderr and exit 1 (2 for bad configuration), for the container's
restart policy to act on. ``--heartbeat-file`` is touched while the service
makes progress, for a container health check to read its age.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from consumers import DEFAULT_INBOX_TABLE
from examples.consumer import InboxConsumer
from examples.flags import add_flag
from examples.shop import TOPIC, Shop
from relay.config import (
    DEFAULT_TABLE,
    KafkaSinkConfig,
    TableName,
    check_database_url,
    is_mysql_url,
    parse_sink_url,
    redact_url,
)
from relay.errors import ConfigError
from relay.logs import configure_from_flags as configure_logging
from relay.signals import STOP_SIGNALS

# Named, not __name__: run with -m, this module is __main__.
logger = logging.getLogger("examples.services")

PROG = "python -m examples.services"
#: The environment prefix of each command's flags.
ENV_PREFIXES = {"shop": "SHOP_", "consumer": "CONSUMER_"}
ORDERS_PER_SECOND = 2.0
FAILURE_RATE = 0.2
SHOP_WORKERS = 2
CONSUMER_GROUP = "shop-orders-consumer"
HEARTBEAT_INTERVAL_SECONDS = 1.0
REPORT_INTERVAL_SECONDS = 10.0
CHECK_INTERVAL_SECONDS = 1.0


# -- command line --------------------------------------------------------------


def env_name(command: str, flag: str) -> str:
    """``shop``, ``--orders-per-second`` -> ``SHOP_ORDERS_PER_SECOND``."""
    return ENV_PREFIXES[command] + flag.removeprefix("--").replace("-", "_").upper()


def _number(kind: Callable[[str], float], ok: Callable[[float], bool], rule: str) -> Callable[[str], Any]:
    """An argparse ``type`` that parses with ``kind`` and accepts what ``ok`` holds true."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
        return value

    return parse


_positive_int = _number(int, lambda n: n >= 1, "at least 1")
_count = _number(int, lambda n: n >= 0, "0 or more")
_rate = _number(float, lambda x: 0 < x < math.inf, "a positive number")
_fraction = _number(float, lambda x: 0 <= x < 1, "at least 0 and less than 1")


class _Flags:
    """Adds one command's flags, each falling back to its environment variable."""

    def __init__(self, parser: argparse.ArgumentParser, command: str, environ: Mapping[str, str]) -> None:
        self.parser = parser
        self.command = command
        # --database-url also falls back to DATABASE_URL, below its own variable.
        database_url = environ.get("DATABASE_URL")
        self.environ = (
            environ if database_url is None else {env_name(command, "--database-url"): database_url, **environ}
        )

    def add(self, flag: str, *, help: str, **options: Any) -> None:
        """Add ``flag`` (``options`` as ``add_argument`` takes them), falling back to its variable."""
        variable = env_name(self.command, flag)
        secret = flag == "--database-url"
        add_flag(self.parser, flag, variable=variable, environ=self.environ, help=help, secret=secret, **options)


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """Both commands with their flags; defaults come from ``environ`` (``os.environ`` when None)."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=PROG, description="The example shop and consumer of compose/.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    shop = _Flags(
        commands.add_parser(
            "shop",
            help="place orders and publish their events until stopped",
            description="Place orders, each step one transaction with its event (some rolled back), until stopped.",
        ),
        "shop",
        environ,
    )
    _common(shop)
    shop.add("--table", help="the outbox table, optionally schema-qualified", default=DEFAULT_TABLE)
    shop.add("--topic", help="the topic of the order events", default=TOPIC)
    shop.add("--orders-per-second", type=_rate, default=ORDERS_PER_SECOND, help="new orders a second")
    shop.add("--failure-rate", type=_fraction, default=FAILURE_RATE, help="share of steps rolled back")
    shop.add("--workers", type=_positive_int, default=SHOP_WORKERS, help="orders in progress at once")
    shop.add("--orders", type=_count, default=0, help="stop after this many orders; 0 never stops")

    consumer = _Flags(
        commands.add_parser(
            "consumer",
            help="process the shop's events once each, through the inbox",
            description="Read the shop's topic in a consumer group and record each event once, through the inbox.",
        ),
        "consumer",
        environ,
    )
    _common(consumer)
    consumer.add(
        "--kafka", metavar="URL", help="kafka://host:port[,host:port][?librdkafka_option=value], as the relay's --sink"
    )
    consumer.add("--topic", help="the topic to read", default=TOPIC)
    consumer.add("--group", help="the Kafka consumer group", default=CONSUMER_GROUP)
    consumer.add("--inbox-table", help="the inbox table, optionally schema-qualified", default=DEFAULT_INBOX_TABLE)
    return parser


def _common(flags: _Flags) -> None:
    flags.add("--database-url", metavar="URL", help="libpq URL of the database (or DATABASE_URL)")
    flags.add("--heartbeat-file", metavar="PATH", help="file touched while the service makes progress")
    flags.add("--log-level", help="DEBUG, INFO, WARNING or ERROR", default="INFO")
    flags.add("--log-format", help="text or json", default="text")


# -- running -------------------------------------------------------------------


class Heartbeat:
    """Touches a file at most once a second; a container health check reads its age."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._last = -math.inf

    def beat(self) -> None:
        """Record progress now."""
        if self.path is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last < HEARTBEAT_INTERVAL_SECONDS:
                return
            self._last = now
        self.path.touch()

    def clear(self) -> None:
        """Remove the file, so a stopped service never looks alive."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class Tally:
    """The shop's books for a run without end: counts only, and a heartbeat per settled transaction."""

    def __init__(self, heartbeat: Heartbeat) -> None:
        self.heartbeat = heartbeat
        self._lock = threading.Lock()
        self.committed_events = 0
        self.rolled_back_events = 0

    def committed(self, idempotency_key: str, order_id: str) -> None:
        """An event whose transaction has just committed."""
        with self._lock:
            self.committed_events += 1
        logger.debug("committed an event of %s", order_id, extra={"action": "shop_committed", "order_id": order_id})
        self.heartbeat.beat()

    def rolled(self, idempotency_key: str) -> None:
        """An event whose transaction was rolled back."""
        with self._lock:
            self.rolled_back_events += 1
        self.heartbeat.beat()

    def counts(self) -> tuple[int, int]:
        """``(committed, rolled back)`` so far."""
        with self._lock:
            return self.committed_events, self.rolled_back_events


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT while inside; restore the old handlers after."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_shop(args: argparse.Namespace, database_url: str, stop: threading.Event) -> None:
    """Place orders until ``stop`` is set or ``--orders`` are placed; raise if a worker fails."""
    TableName.parse(args.table)
    heartbeat = Heartbeat(args.heartbeat_file)
    tally = Tally(heartbeat)
    shop = Shop(
        database_url,
        tally,
        orders=args.orders or None,
        workers=args.workers,
        failure_rate=args.failure_rate,
        table=args.table,
        topic=args.topic,
        orders_per_second=args.orders_per_second,
    )
    shop.prepare()
    logger.info(
        "shop open: %.1f orders a second into %s, %.0f%% of steps rolled back",
        args.orders_per_second,
        args.table,
        args.failure_rate * 100,
        extra={"action": "shop_start", "topic": args.topic},
    )
    heartbeat.beat()
    shop.start()
    try:
        reported = time.monotonic()
        while not shop.done() and not stop.wait(CHECK_INTERVAL_SECONDS):
            if time.monotonic() - reported >= REPORT_INTERVAL_SECONDS:
                reported = time.monotonic()
                _report_shop(tally, "shop open")
    finally:
        shop.stop()
        heartbeat.clear()
    shop.done()
    _report_shop(tally, "shop closed")


def _report_shop(tally: Tally, what: str) -> None:
    committed, rolled_back = tally.counts()
    logger.info(
        "%s: %d events committed, %d rolled back",
        what,
        committed,
        rolled_back,
        extra={"action": "shop_tally", "committed": committed, "rolled_back": rolled_back},
    )


def run_consumer(args: argparse.Namespace, database_url: str, stop: threading.Event) -> None:
    """Consume until ``stop`` is set; raise on a database or fatal Kafka error."""
    if not args.kafka:
        raise ConfigError(f"no Kafka configured: set --kafka or {env_name('consumer', '--kafka')} (kafka://host:port)")
    source = parse_sink_url(args.kafka)
    if not isinstance(source, KafkaSinkConfig):
        raise ConfigError("--kafka must be a kafka:// URL")
    TableName.parse(args.inbox_table)
    heartbeat = Heartbeat(args.heartbeat_file)
    consumer = InboxConsumer(source, database_url, topic=args.topic, group=args.group, inbox_table=args.inbox_table)
    consumer.prepare()
    logger.info(
        "consumer started: topic %s, group %s",
        args.topic,
        args.group,
        extra={"action": "consumer_start", "topic": args.topic, "group": args.group},
    )
    try:
        consumer.run(stop, on_poll=heartbeat.beat)
    finally:
        heartbeat.clear()
        logger.info(
            "consumer stopped: %d processed, %d duplicates skipped, %d unreadable",
            consumer.processed,
            consumer.duplicates,
            consumer.unreadable,
            extra={"action": "consumer_tally", "processed": consumer.processed, "duplicates": consumer.duplicates},
        )


COMMANDS: dict[str, Callable[[argparse.Namespace, str, threading.Event], None]] = {
    "shop": run_shop,
    "consumer": run_consumer,
}


def _password(url: str) -> str | None:
    try:
        password = psycopg.conninfo.conninfo_to_dict(url).get("password")
    except psycopg.ProgrammingError:
        return None
    return str(password) if password else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one example service; return the exit code."""
    args = build_parser().parse_args(argv)
    name = f"{PROG} {args.command}"
    secrets = [s for s in (_password(args.database_url or ""), _kafka_password(args)) if s]
    if not configure_logging(name, args.log_level, args.log_format, secrets):
        return 2
    stop = threading.Event()
    try:
        if not args.database_url:
            flag_env = env_name(args.command, "--database-url")
            raise ConfigError(f"no database configured: set --database-url, {flag_env} or DATABASE_URL")
        database_url = check_database_url(args.database_url)
        if is_mysql_url(database_url):
            raise ConfigError(
                f"unknown database URL scheme for the example services in {redact_url(database_url)!r}: "
                "they run on PostgreSQL only (postgresql://)"
            )
        with stop_on_signals(stop):
            COMMANDS[args.command](args, database_url, stop)
    except ConfigError as exc:
        print(f"{name}: error: {_scrub(str(exc), secrets)}", file=sys.stderr)
        return 2
    except (psycopg.Error, KafkaException, RuntimeError, OSError) as exc:
        print(f"{name}: error: {_scrub(str(exc), secrets)}", file=sys.stderr)
        return 1
    return 0


def _kafka_password(args: argparse.Namespace) -> str | None:
    try:
        source = parse_sink_url(getattr(args, "kafka", None) or "")
    except ConfigError:
        return None
    if isinstance(source, KafkaSinkConfig):
        return next((v for k, v in source.options.items() if "password" in k), None)
    return None


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return " ".join(text.split()) or "failed"


if __name__ == "__main__":
    sys.exit(main())
