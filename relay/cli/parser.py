"""The ``outbox-relay`` argument parser: every command and flag, for ``main`` and the generated docs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from relay import __version__, config
from relay.cli.flags import (
    PROG,
    TIME_FORMS,
    KeyOnce,
    Once,
    RouteList,
    age,
    duration,
    env_flag,
    env_switch,
    env_value,
    event_id,
    port,
    positive_int,
    role_name,
    seconds,
    shown_topics,
    switch_default,
    timestamp,
    topic,
)
from relay.config import split_routes

if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]  # what add_subparsers returns


#: Each command's one-line summary (in ``--help``) and its description (in ``COMMAND --help``).
ABOUT: dict[str, tuple[str, str]] = {
    "migrate": (
        "create or upgrade the outbox table (idempotent)",
        "Create or upgrade the outbox table. Safe to run twice or at once.",
    ),
    "run": (
        "relay events until SIGTERM/SIGINT",
        "Relay events until SIGTERM or SIGINT, then settle the batch in hand.",
    ),
    "status": (
        "counts of pending, in-flight, retrying and dead-lettered events",
        "Counts of pending, in-flight, retrying and dead-lettered events; then the topics with retrying "
        "(failing, not yet dead-lettered) events, and the topics with the oldest pending events.",
    ),
    "dead": (
        "list dead-lettered events",
        "List dead-lettered events.",
    ),
    "requeue": (
        "put dead-lettered events back, attempts reset",
        "Put dead-lettered events back to pending with attempts reset.",
    ),
    "retry": (
        "try retrying events again now",
        "Make retrying events (failing, not dead-lettered: pending, an attempt behind them, not in flight) due "
        "now, instead of after their backoff: for an event whose cause was fixed (a queue bound, a topic "
        "created). Their attempts stay as they are. A dead-lettered event is put back with requeue.",
    ),
    "skip": (
        "give up on one event and release its key",
        "Mark a dead-lettered (or waiting) event skipped so the later events of its key flow again.",
    ),
    "inspect": (
        "show one event",
        "Show every column of one event.",
    ),
    "purge": (
        "delete kept sent events older than a duration",
        "Delete sent and skipped events older than --older-than, in small batches. "
        "Unsent events (pending, in flight, dead-lettered) are never deleted.",
    ),
    "replay": (
        "send kept events again, keeping their idempotency keys",
        "Put already-sent events that retention kept (run --keep-sent) back to pending. "
        "They keep their idempotency keys, so consumers that have them drop the copies.",
    ),
}


#: ``run``'s tuning flags, in the order ``--help`` lists them, with their types and defaults...
_RUN_SETTINGS: dict[str, tuple[Callable[[str], float], float]] = {
    "--batch-size": (positive_int, config.BATCH_SIZE),
    "--batch-bytes": (positive_int, config.BATCH_BYTES),
    "--max-attempts": (positive_int, config.MAX_ATTEMPTS),
    "--backoff-initial": (seconds, config.BACKOFF_INITIAL_SECONDS),
    "--backoff-max": (seconds, config.BACKOFF_MAX_SECONDS),
    "--lease-seconds": (seconds, config.LEASE_SECONDS),
    "--publish-timeout": (seconds, config.PUBLISH_TIMEOUT_SECONDS),
    "--poll-interval": (seconds, config.POLL_INTERVAL_SECONDS),
    "--poll-interval-max": (seconds, config.POLL_INTERVAL_MAX_SECONDS),
    "--pipeline-depth": (positive_int, config.PIPELINE_DEPTH),
}
#: ...and what they mean.
_RUN_HELP = {
    "--batch-size": "most events claimed at once",
    "--batch-bytes": "a claim stops adding events once their payloads and headers reach this many bytes "
    "(at least one event)",
    "--max-attempts": "attempts before an event is dead-lettered",
    "--backoff-initial": "seconds before the first retry; doubles each attempt, with jitter",
    "--backoff-max": "longest retry delay",
    "--lease-seconds": "how long a claim lasts before another relay may take it over. run refuses a lease shorter "
    f"than {config.CLAIM_RESERVE_SECONDS:g} s to claim + --publish-timeout + the sink's grace (Kafka 5 s, "
    f"RabbitMQ 10 s; with --route, the slowest route's) + {config.SETTLE_RESERVE_SECONDS:g} s to settle",
    "--publish-timeout": "seconds to wait for the broker's acknowledgements of a batch",
    "--poll-interval": "seconds between polls when idle (doubles up to --poll-interval-max)",
    "--poll-interval-max": "longest wait between polls while idle",
    "--pipeline-depth": "batches published at the same time",
}


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, as every other configuration error."""

    def error(self, message: str) -> NoReturn:
        """Say what is wrong on one line, where to look, and exit 2."""
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, for ``main`` and for the generated docs."""
    parser: argparse.ArgumentParser = Parser(
        prog=PROG,
        description="Deliver a PostgreSQL or MySQL outbox table to Kafka or RabbitMQ, at least once, in key order.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_migrate(commands)
    _add_run(commands)
    _add_admin_commands(commands)
    return parser


#: The commands that log at INFO by default: the long-running service and the schema change.
_LOGGING = ("run", "migrate")


def _command(commands: Commands, name: str) -> argparse.ArgumentParser:
    """Subcommand ``name`` with the flags every command has: database, table, logging."""
    summary, description = ABOUT[name]
    parser = commands.add_parser(name, help=summary, description=description)
    env_flag(
        parser,
        "--database-url",
        help="URL of the database holding the outbox: postgresql://... (libpq) or mysql://user:pass@host:3306/db "
        "(MySQL 8 or MariaDB; mariadb:// too) (or DATABASE_URL; give a password there: in a flag, ps shows it "
        "for a moment)",
        metavar="URL",
    )
    env_flag(parser, "--table", help="outbox table, optionally schema-qualified", default=config.DEFAULT_TABLE)
    env_flag(
        parser,
        "--table-layout",
        help="native (the relay's own table) or debezium (Debezium's outbox table: id uuid, aggregatetype, "
        "aggregateid, type, payload; see docs/debezium.md)",
        default="native",
    )
    if name != "migrate":
        env_flag(
            parser,
            "--topic-template",
            help="with --table-layout debezium: the topic of each event, {aggregatetype} filled in "
            f"(default: {config.DEFAULT_TOPIC_TEMPLATE})",
            metavar="TEMPLATE",
        )
    # The service and the schema change log what they do; an operator's command answers on
    # stdout, and its stderr holds only what went wrong (a one-line error, not a log of connecting).
    env_flag(
        parser, "--log-level", help="DEBUG, INFO, WARNING or ERROR", default="INFO" if name in _LOGGING else "WARNING"
    )
    env_flag(parser, "--log-format", help="text or json", default="text")
    if name in ("run", "migrate"):
        env_flag(
            parser,
            "--source",
            help="where events come from: table (claim rows of the outbox table) or log (PostgreSQL 14+ logical "
            "decoding through --slot; see docs/log-source.md)",
            default="table",
        )
    if name in ("run", "migrate", "status"):
        env_flag(
            parser,
            "--slot",
            help="the log source's replication slot (and publication) name, [a-z0-9_]{1,63}"
            + ("" if name != "status" else ": also show its lag, wal_status and reader"),
            metavar="NAME",
        )
    return parser


def _add_migrate(commands: Commands) -> None:
    migrate = _command(commands, "migrate")
    notify_env = env_value("--notify")
    migrate.add_argument(
        "--notify",
        action=argparse.BooleanOptionalAction,
        default=switch_default(migrate, "RELAY_NOTIFY", notify_env, None),
        help="switch the NOTIFY-on-insert trigger on or off (default: leave as is; on when created). "
        "On wakes relays at once; off saves writers a global lock at commit and relays poll instead "
        "[env RELAY_NOTIFY]",
    )
    env_switch(
        migrate,
        "--create-roles",
        default=False,
        help="also create NOLOGIN roles with least privilege: one for relays, one for writers",
    )
    env_flag(
        migrate,
        "--relay-role",
        type=role_name,
        default="outbox_relay",
        help="name of the relay role for --create-roles",
    )
    env_flag(
        migrate,
        "--writer-role",
        type=role_name,
        default="outbox_writer",
        help="name of the writer role for --create-roles",
    )


def _add_run(commands: Commands) -> None:
    run = _command(commands, "run")
    env_flag(
        run,
        "--sink",
        help="where events go (with --route: the catch-all route, tried last): "
        "kafka://host:port[,host:port][?option=value] or "
        "amqp://user:pass@host:port/vhost[?exchange=NAME[&declare=topic]] "
        "(either takes the option format=native, the default, cloudevents or cloudevents-structured; "
        "a password goes in the variable: in a flag, ps shows it for a moment)",
        metavar="URL",
    )
    env_flag(
        run,
        "--event-source",
        help="the CloudEvents 'source' of every event, a URI-reference (for sinks with format=cloudevents or "
        "cloudevents-structured; default: /outbox-relay/DATABASE/TABLE, never a user, password or host)",
        metavar="URI",
    )
    routes_env = env_value("--routes")
    run.add_argument(
        "--route",
        action=RouteList,
        dest="routes",
        default=split_routes(routes_env) if routes_env is not None else None,
        metavar="PATTERN=URL",
        help="send topics matching the shell-style glob PATTERN (fnmatch, case-sensitive) to the sink at URL; "
        "repeat it for more routes: the first match wins, --sink comes last. A topic no route matches is "
        "dead-lettered. RELAY_ROUTES holds routes separated by spaces or newlines [env RELAY_ROUTES]",
    )
    for flag, (kind, default) in _RUN_SETTINGS.items():
        env_flag(run, flag, type=kind, default=default, help=_RUN_HELP[flag])
    fields_env = env_value("--field-headers")
    run.add_argument(
        "--field-header",
        action=RouteList,
        dest="field_headers",
        default=fields_env.replace(",", " ").split() if fields_env is not None else None,
        metavar="COLUMN=HEADER",
        help="with --table-layout debezium: also send the value of COLUMN as header HEADER (e.g. type=eventType); "
        "repeat it for more. RELAY_FIELD_HEADERS holds them separated by commas or spaces [env RELAY_FIELD_HEADERS]",
    )
    env_switch(run, "--listen", default=True, help="wake on NOTIFY as well as polling (PostgreSQL; MySQL always polls)")
    env_switch(run, "--keep-sent", default=False, help="keep acknowledged events as 'sent' instead of deleting them")
    env_flag(
        run,
        "--retention",
        help="purge what the table keeps (skipped events; with --keep-sent, sent ones) once older than this "
        "(e.g. 7d, 12h), in small batches every minute",
        type=duration,
        metavar="DURATION",
    )
    env_flag(
        run,
        "--metrics-port",
        type=port,
        help="serve /metrics, /healthz and /readyz on this port",
        metavar="N",
    )
    env_flag(run, "--metrics-host", default=config.DEFAULT_METRICS_HOST, help="address for --metrics-port")
    env_flag(
        run,
        "--startup-timeout",
        type=seconds,
        default=0.0,
        help="seconds to keep trying to reach the database and broker at start-up",
    )


def _add_admin_commands(commands: Commands) -> None:
    status = _command(commands, "status")
    env_switch(status, "--json", default=False, help="print one JSON object")
    env_flag(
        status,
        "--topics",
        type=shown_topics,
        default=10,
        metavar="N",
        help="show this many topics with retrying events, and this many with the oldest pending events "
        "(0: none, and no per-topic pass over the table)",
    )

    dead = _command(commands, "dead")
    env_switch(dead, "--json", default=False, help="print a JSON array")
    env_flag(dead, "--limit", type=positive_int, default=1000, help="most events listed")
    dead.add_argument("--topic", type=topic, action=Once, help="only the dead letters of this topic")

    requeue = _command(commands, "requeue")
    which = requeue.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=event_id, action=Once, help="one event by id")
    which.add_argument("--topic", type=topic, action=Once, help="every dead-lettered event of a topic")
    which.add_argument(
        "--key", "--key-hex", action=KeyOnce, help=f"every dead-lettered event of a key ('' is a key); {_KEY_HEX_HELP}"
    )
    which.add_argument("--all", action="store_true", help="every dead-lettered event")
    env_switch(requeue, "--json", default=False, help="print the requeued ids as JSON")
    _dry_run(requeue, "requeue")

    retry = _command(commands, "retry")
    which = retry.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=event_id, action=Once, help="one retrying event by id")
    which.add_argument("--topic", type=topic, action=Once, help="every retrying event of a topic")
    which.add_argument("--all", action="store_true", help="every retrying event")
    env_switch(retry, "--json", default=False, help="print the ids made due as JSON")

    skip = _command(commands, "skip")
    skip.add_argument("--id", type=event_id, action=Once, required=True, help="the event to skip")
    env_switch(skip, "--json", default=False, help="print the skipped id as JSON ([] when it was not skipped)")
    _dry_run(skip, "skip")
    env_flag(
        skip,
        "--publish-timeout",
        type=seconds,
        default=config.PUBLISH_TIMEOUT_SECONDS,
        help="the relays' --publish-timeout: an event whose lease ended less than this plus 10 s ago "
        "may still be in flight and is not skipped",
    )

    inspect = _command(commands, "inspect")
    inspect.add_argument("id", type=event_id, help="the event id")
    env_switch(inspect, "--json", default=False, help="print one JSON object")

    purge = _command(commands, "purge")
    env_flag(
        purge,
        "--older-than",
        type=age,
        metavar="DURATION",
        help="e.g. 7d, 12h, 30m, 90s, or an ISO-8601 time (required). A sent event's age runs from its publish, "
        "a skipped one's from its skip",
    )
    env_switch(purge, "--json", default=False, help="print the count as JSON")
    _dry_run(purge, "purge")

    replay = _command(commands, "replay")
    replay.add_argument(
        "--since", type=timestamp, action=Once, metavar="TIME", help=f"sent at or after this time: {TIME_FORMS}"
    )
    replay.add_argument("--until", type=timestamp, action=Once, metavar="TIME", help="sent before this time (as since)")
    keys = replay.add_mutually_exclusive_group()
    keys.add_argument("--key", "--key-hex", action=KeyOnce, help=f"only this key ('' is a key); {_KEY_HEX_HELP}")
    replay.add_argument("--topic", type=topic, action=Once, help="only this topic")
    replay.add_argument("--all", action="store_true", help="every kept event (required when no filter is given)")
    env_switch(replay, "--json", default=False, help="print the replayed ids as JSON")
    _dry_run(replay, "replay")


_KEY_HEX_HELP = (
    "--key-hex takes the hex of its bytes, as dead and inspect show a key that is not printable text "
    "(bytes that are not UTF-8, a control character): key_hex=..."
)


def _dry_run(parser: argparse.ArgumentParser, command: str) -> None:
    env_switch(
        parser,
        "--dry-run",
        default=False,
        help=f"say what {command} would change (how many events; with --json, their ids), and change nothing",
    )
