"""The ``outbox-relay`` command line.

The environment is read here and nowhere else: every flag falls back to
``RELAY_<FLAG>`` (and the database URL to ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from relay import __version__, config
from relay.config import (
    RelaySettings,
    TableName,
    check_database_url,
    parse_duration,
    parse_route,
    parse_sink_url,
    redact_url,
    resolve_routes,
    split_routes,
)
from relay.errors import ConfigError, RelayError
from relay.logs import configure_from_flags as configure_logging
from relay.store.base import Admin, ReplayFilter, RequeueFilter

PROG = "outbox-relay"
T = TypeVar("T")


def _env_name(flag: str) -> str:
    """``--batch-size`` -> ``RELAY_BATCH_SIZE``."""
    return "RELAY_" + flag.lstrip("-").replace("-", "_").upper()


def _env(flag: str) -> str | None:
    value = os.environ.get(_env_name(flag))
    if value is None and flag == "--database-url":
        value = os.environ.get("DATABASE_URL")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number")
    return value


def add_env_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    env: str,
    raw: str | None,
    prog: str,
    help: str,
    type: Callable[[str], Any] = str,
    default: Any = None,
    metavar: str | None = None,
    show_default: bool = True,
) -> None:
    """Add ``flag``; ``raw``, the value of variable ``env`` when set, replaces the default.

    A value the flag's ``type`` refuses ends the program with a one-line error
    naming the variable (:func:`reject_bad_env`), but only when the command
    that has the flag runs: ``--help`` and other commands still work. The help
    names the variable (and the default, unless ``show_default`` is off, as for
    URLs that may hold a password).
    """
    if raw is not None:
        try:
            default = type(raw)
        except argparse.ArgumentTypeError as exc:
            default = _BadEnv(parser, f"{prog}: error: {env}: {exc}")
    shown = f" (default: {default})" if show_default and default is not None else ""
    parser.add_argument(flag, type=type, default=default, metavar=metavar, help=f"{help} [env {env}]{shown}")


class _BadEnv:
    """The default of a flag whose variable holds a value the flag refuses."""

    def __init__(self, parser: argparse.ArgumentParser, error: str) -> None:
        self.parser = parser
        self.error = error

    def __str__(self) -> str:
        return "invalid"


def reject_bad_env(args: argparse.Namespace) -> None:
    """End with the one-line error of the first refused variable the parsed command uses."""
    for value in vars(args).values():
        if isinstance(value, _BadEnv):
            value.parser.exit(2, f"{value.error}\n")


def _flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    type: Callable[[str], Any] = str,
    default: Any = None,
    metavar: str | None = None,
) -> None:
    """Add ``flag`` with its ``RELAY_*`` fallback named in the help."""
    add_env_flag(
        parser, flag, env=_env_name(flag), raw=_env(flag), prog=PROG, help=help, type=type, default=default,
        metavar=metavar, show_default=flag not in ("--database-url", "--sink"),
    )  # fmt: skip


def _switch(parser: argparse.ArgumentParser, flag: str, *, help: str, default: bool) -> None:
    raw = _env(flag)
    if raw is not None:
        default = raw.strip().lower() in ("1", "true", "yes", "on")
    parser.add_argument(
        flag, action=argparse.BooleanOptionalAction, default=default, help=f"{help} [env {_env_name(flag)}]"
    )


class _Routes(argparse.Action):
    """Collect ``--route`` values in order; the first one given replaces ``RELAY_ROUTES``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        routes = [] if current is None or current is self.default else list(current)
        routes.append(values)
        setattr(namespace, self.dest, routes)


def _common(parser: argparse.ArgumentParser) -> None:
    _flag(
        parser,
        "--database-url",
        help="libpq URL of the database holding the outbox (or DATABASE_URL)",
        metavar="URL",
    )
    _flag(parser, "--table", help="outbox table, optionally schema-qualified", default=config.DEFAULT_TABLE)
    _flag(parser, "--log-level", help="DEBUG, INFO, WARNING or ERROR", default="INFO")
    _flag(parser, "--log-format", help="text or json", default="text")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, for ``main`` and for the generated docs."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Deliver a PostgreSQL outbox table to Kafka or RabbitMQ, at least once, in key order.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the outbox table (idempotent)",
        description="Create or upgrade the outbox table. Safe to run twice or at once.",
    )
    _common(migrate)
    notify_env = _env("--notify")
    migrate.add_argument(
        "--notify",
        action=argparse.BooleanOptionalAction,
        default=None if notify_env is None else notify_env.strip().lower() in ("1", "true", "yes", "on"),
        help="switch the NOTIFY-on-insert trigger on or off (default: leave as is; on when created). "
        "On wakes relays at once; off saves writers a global lock at commit and relays poll instead "
        "[env RELAY_NOTIFY]",
    )
    _switch(
        migrate,
        "--create-roles",
        default=False,
        help="also create NOLOGIN roles with least privilege: one for relays, one for writers",
    )
    _flag(migrate, "--relay-role", default="outbox_relay", help="name of the relay role for --create-roles")
    _flag(migrate, "--writer-role", default="outbox_writer", help="name of the writer role for --create-roles")

    run = commands.add_parser(
        "run",
        help="relay events until SIGTERM/SIGINT",
        description="Relay events until SIGTERM or SIGINT, then settle the batch in hand.",
    )
    _common(run)
    _flag(
        run,
        "--sink",
        help="where events go (with --route: the catch-all route, tried last): "
        "kafka://host:port[,host:port][?option=value] or amqp://user:pass@host:port/vhost[?exchange=NAME]",
        metavar="URL",
    )
    routes_env = _env("--routes")
    run.add_argument(
        "--route",
        action=_Routes,
        dest="routes",
        default=split_routes(routes_env) if routes_env is not None else None,
        metavar="PATTERN=URL",
        help="send topics matching the shell-style glob PATTERN (fnmatch, case-sensitive) to the sink at URL; "
        "repeat it for more routes: the first match wins, --sink comes last. A topic no route matches is "
        "dead-lettered. RELAY_ROUTES holds routes separated by spaces or newlines [env RELAY_ROUTES]",
    )
    _flag(run, "--batch-size", type=_positive_int, default=config.BATCH_SIZE, help="most events claimed at once")
    _flag(
        run,
        "--max-attempts",
        type=_positive_int,
        default=config.MAX_ATTEMPTS,
        help="attempts before an event is dead-lettered",
    )
    _flag(
        run,
        "--backoff-initial",
        type=_seconds,
        default=config.BACKOFF_INITIAL_SECONDS,
        help="seconds before the first retry; doubles each attempt, with jitter",
    )
    _flag(run, "--backoff-max", type=_seconds, default=config.BACKOFF_MAX_SECONDS, help="longest retry delay")
    _flag(
        run,
        "--lease-seconds",
        type=_seconds,
        default=config.LEASE_SECONDS,
        help="how long a claim lasts before another relay may take it over",
    )
    _flag(
        run,
        "--publish-timeout",
        type=_seconds,
        default=config.PUBLISH_TIMEOUT_SECONDS,
        help="seconds to wait for the broker's acknowledgements of a batch",
    )
    _flag(
        run,
        "--poll-interval",
        type=_seconds,
        default=config.POLL_INTERVAL_SECONDS,
        help="seconds between polls when idle (doubles up to --poll-interval-max)",
    )
    _flag(
        run,
        "--poll-interval-max",
        type=_seconds,
        default=config.POLL_INTERVAL_MAX_SECONDS,
        help="longest wait between polls while idle",
    )
    _flag(
        run,
        "--pipeline-depth",
        type=_positive_int,
        default=config.PIPELINE_DEPTH,
        help="batches published at the same time",
    )
    _switch(run, "--listen", default=True, help="wake on NOTIFY as well as polling")
    _switch(run, "--keep-sent", default=False, help="keep acknowledged events as 'sent' instead of deleting them")
    _flag(
        run,
        "--retention",
        help="with --keep-sent: purge sent events older than this (e.g. 7d, 12h) in small batches every minute",
        metavar="DURATION",
    )
    _flag(
        run,
        "--metrics-port",
        type=_port,
        help="serve /metrics, /healthz and /readyz on this port",
        metavar="N",
    )
    _flag(run, "--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    _flag(
        run,
        "--startup-timeout",
        type=_seconds,
        default=0.0,
        help="seconds to keep trying to reach the database and broker at start-up",
    )

    status = commands.add_parser(
        "status",
        help="counts of pending, in-flight and dead-lettered events",
        description="Counts of pending, in-flight and dead-lettered events.",
    )
    _common(status)
    _switch(status, "--json", default=False, help="print one JSON object")

    dead = commands.add_parser("dead", help="list dead-lettered events", description="List dead-lettered events.")
    _common(dead)
    _switch(dead, "--json", default=False, help="print a JSON array")
    _flag(dead, "--limit", type=_positive_int, default=1000, help="most events listed")

    requeue = commands.add_parser(
        "requeue",
        help="put dead-lettered events back, attempts reset",
        description="Put dead-lettered events back to pending with attempts reset.",
    )
    _common(requeue)
    which = requeue.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=_positive_int, help="one event by id")
    which.add_argument("--topic", help="every dead-lettered event of a topic")
    which.add_argument("--key", help="every dead-lettered event of a key")
    which.add_argument("--all", action="store_true", help="every dead-lettered event")
    _switch(requeue, "--json", default=False, help="print the requeued ids as JSON")

    skip = commands.add_parser(
        "skip",
        help="give up on one event and release its key",
        description="Mark a dead-lettered (or waiting) event skipped so the later events of its key flow again.",
    )
    _common(skip)
    skip.add_argument("--id", type=_positive_int, required=True, help="the event to skip")

    inspect = commands.add_parser("inspect", help="show one event", description="Show every column of one event.")
    _common(inspect)
    inspect.add_argument("id", type=_positive_int, help="the event id")
    _switch(inspect, "--json", default=False, help="print one JSON object")

    purge = commands.add_parser(
        "purge",
        help="delete kept sent events older than a duration",
        description="Delete sent and skipped events older than --older-than, in small batches. "
        "Unsent events (pending, in flight, dead-lettered) are never deleted.",
    )
    _common(purge)
    _flag(purge, "--older-than", metavar="DURATION", help="e.g. 7d, 12h, 30m, 90s (required)")
    _switch(purge, "--json", default=False, help="print the count as JSON")

    replay = commands.add_parser(
        "replay",
        help="send kept events again, keeping their idempotency keys",
        description="Put already-sent events that retention kept (run --keep-sent) back to pending. "
        "They keep their idempotency keys, so consumers that have them drop the copies.",
    )
    _common(replay)
    replay.add_argument("--since", type=_timestamp, help="sent at or after this ISO-8601 time")
    replay.add_argument("--until", type=_timestamp, help="sent before this ISO-8601 time")
    replay.add_argument("--key", help="only this key")
    replay.add_argument("--topic", help="only this topic")
    replay.add_argument("--all", action="store_true", help="every kept event (required when no filter is given)")
    _switch(replay, "--json", default=False, help="print the replayed ids as JSON")
    return parser


def _timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _database(args: argparse.Namespace) -> tuple[str, TableName]:
    return check_database_url(args.database_url or ""), TableName.parse(args.table)


def _admin(args: argparse.Namespace) -> Admin:
    from relay.store.postgres import PostgresAdmin

    dsn, table = _database(args)
    return PostgresAdmin(dsn, table)


async def _with_admin(args: argparse.Namespace, work: Callable[[Admin], Awaitable[T]]) -> T:
    admin = _admin(args)
    try:
        await admin.open()
        return await work(admin)
    finally:
        await admin.close()


def _on_store(args: argparse.Namespace, call: Callable[[Admin], Awaitable[T]]) -> T:
    """Open the store, await ``call(store)``, close the store; the admin commands' one way in."""
    return asyncio.run(_with_admin(args, call))


def cmd_migrate(args: argparse.Namespace) -> int:
    """``outbox-relay migrate``."""
    from relay.store.migrate import migrate

    dsn, table = _database(args)
    applied = migrate(dsn, table, notify=args.notify)
    print(f"{table}: applied {', '.join(map(str, applied))}" if applied else f"{table}: up to date")
    if args.create_roles:
        from relay.store.migrate import create_roles

        create_roles(dsn, table, relay_role=args.relay_role, writer_role=args.writer_role)
        print(f"{table}: roles {args.relay_role} (relay) and {args.writer_role} (writer) granted")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``outbox-relay run``."""
    from relay.app import RunConfig, serve

    dsn, table = _database(args)
    settings = RelaySettings(
        batch_size=args.batch_size,
        max_attempts=args.max_attempts,
        backoff_initial_seconds=args.backoff_initial,
        backoff_max_seconds=args.backoff_max,
        lease_seconds=args.lease_seconds,
        publish_timeout_seconds=args.publish_timeout,
        poll_interval_seconds=args.poll_interval,
        poll_interval_max_seconds=max(args.poll_interval, args.poll_interval_max),
        pipeline_depth=args.pipeline_depth,
        listen=args.listen,
    )
    routes = resolve_routes(args.routes or [], args.sink)
    run_config = RunConfig(
        database_url=dsn,
        table=table,
        sink=parse_sink_url(args.sink or "") if args.sink or not routes else None,
        routes=routes,
        settings=settings,
        keep_sent=args.keep_sent,
        retention_seconds=parse_duration(args.retention) if args.retention else None,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        startup_timeout_seconds=args.startup_timeout,
    )
    asyncio.run(serve(run_config))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """``outbox-relay status``."""

    status = _on_store(args, lambda store: store.status())
    if args.json:
        print(json.dumps(status.as_dict()))
    else:
        print(
            f"pending: {status.pending}\nin flight: {status.in_flight}\nfailed: {status.failed}\n"
            f"parked keys: {status.parked_keys}\n"
            f"oldest pending age: {status.oldest_pending_age_seconds:.1f}s"
        )
    return 0


def cmd_dead(args: argparse.Namespace) -> int:
    """``outbox-relay dead``."""

    events = _on_store(args, lambda store: store.dead(args.limit))
    if len(events) == args.limit:
        # stderr, so that --json stays one parsable document.
        print(f"{PROG}: showing the oldest {args.limit} dead letters; there may be more (--limit)", file=sys.stderr)
    if args.json:
        print(json.dumps([e.as_dict() for e in events]))
        return 0
    if not events:
        print("no dead-lettered events")
    for e in events:
        blocks = f" blocks key {e.key!r} ({e.blocked_events} waiting)" if e.blocked_events else ""
        print(f"{e.id}\t{e.topic}\tkey={e.key}\tattempts={e.attempts}{blocks}\t{e.last_error}")
    return 0


def cmd_requeue(args: argparse.Namespace) -> int:
    """``outbox-relay requeue``."""
    selection = RequeueFilter(id=args.id, topic=args.topic, key=args.key, all=args.all)

    ids = _on_store(args, lambda store: store.requeue(selection))
    print(json.dumps({"requeued": ids}) if args.json else f"requeued {len(ids)} events")
    return 0


def cmd_skip(args: argparse.Namespace) -> int:
    """``outbox-relay skip``."""

    if not _on_store(args, lambda store: store.skip(args.id)):
        print(
            f"{PROG}: error: event {args.id} is not dead-lettered or waiting (or does not exist)",
            file=sys.stderr,
        )
        return 1
    print(f"skipped event {args.id}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """``outbox-relay inspect``."""

    row = _on_store(args, lambda store: store.inspect(args.id))
    if row is None:
        print(f"{PROG}: error: no event {args.id}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(row, default=str))
    else:
        for name, value in row.items():
            print(f"{name}: {value}")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    """``outbox-relay purge``."""
    if not args.older_than:
        raise ConfigError("purge needs --older-than DURATION (or RELAY_OLDER_THAN)")
    seconds = parse_duration(args.older_than)

    deleted = _on_store(args, lambda store: store.purge(seconds))
    print(json.dumps({"purged": deleted}) if args.json else f"purged {deleted} events")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """``outbox-relay replay``."""
    if not (args.all or args.since or args.until or args.key or args.topic):
        raise ConfigError("replay needs --since, --until, --key, --topic or --all")

    selection = ReplayFilter(since=args.since, until=args.until, key=args.key, topic=args.topic, all=args.all)
    ids = _on_store(args, lambda store: store.replay(selection))
    print(json.dumps({"replayed": ids}) if args.json else f"replayed {len(ids)} events")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "migrate": cmd_migrate,
    "run": cmd_run,
    "status": cmd_status,
    "dead": cmd_dead,
    "requeue": cmd_requeue,
    "skip": cmd_skip,
    "inspect": cmd_inspect,
    "purge": cmd_purge,
    "replay": cmd_replay,
}


def _secrets(args: argparse.Namespace) -> list[str]:
    from relay.store.postgres import password_of

    found = [password_of(args.database_url or "") or ""]
    sinks: list[config.SinkConfig] = []
    sink = getattr(args, "sink", None)
    if sink:
        with contextlib.suppress(ConfigError):
            sinks.append(parse_sink_url(sink))
    for route in getattr(args, "routes", None) or []:
        with contextlib.suppress(ConfigError):
            sinks.append(parse_route(route).sink)
    for parsed in sinks:
        if isinstance(parsed, config.KafkaSinkConfig):
            found += [v for k, v in parsed.options.items() if "password" in k]
        elif isinstance(parsed, config.AmqpSinkConfig):
            from urllib.parse import urlsplit

            found.append(urlsplit(parsed.url).password or "")
    return [s for s in found if s]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outbox-relay`` console script."""
    args = build_parser().parse_args(argv)
    reject_bad_env(args)
    secrets = _secrets(args)
    if not configure_logging(PROG, args.log_level, args.log_format, secrets):
        return 2
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"{PROG}: error: {_scrub(str(exc), secrets)}", file=sys.stderr)
        return 2
    except RelayError as exc:
        print(f"{PROG}: error: {_scrub(str(exc), secrets)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return " ".join(text.split())


__all__ = ["add_env_flag", "build_parser", "main", "redact_url", "reject_bad_env"]
