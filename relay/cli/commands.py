"""``outbox-relay migrate`` and ``outbox-relay run``."""

from __future__ import annotations

import argparse
import asyncio

from relay.config import (
    DEFAULT_METRICS_HOST,
    RelaySettings,
    TableLayout,
    TableName,
    check_database_url,
    parse_sink_url,
    resolve_routes,
)
from relay.errors import ConfigError


def database(args: argparse.Namespace) -> tuple[str, TableName]:
    """The checked ``--database-url`` and ``--table`` of any command."""
    return check_database_url(args.database_url or ""), TableName.parse(args.table)


def table_layout(args: argparse.Namespace) -> TableLayout:
    """The checked ``--table-layout``, with ``--topic-template`` and ``--field-header`` where the command has them."""
    return TableLayout.parse(
        args.table_layout,
        topic_template=getattr(args, "topic_template", None),
        field_headers=getattr(args, "field_headers", None) or (),
    )


def source_and_slot(args: argparse.Namespace) -> tuple[str, str | None]:
    """The checked ``--source`` and ``--slot``."""
    from relay.sources import LOG, SOURCES

    source = (args.source or "table").strip().lower()
    if source not in SOURCES:
        raise ConfigError(f"invalid --source {args.source[:40]!r}: table or log (RELAY_SOURCE)")
    if source == LOG:
        from relay.sources.log.publication import check_slot_name

        if not args.slot:
            raise ConfigError("--source log needs --slot NAME (RELAY_SLOT)")
        return source, check_slot_name(args.slot)
    if args.slot:
        raise ConfigError("--slot goes with --source log (RELAY_SOURCE=log)")
    return source, None


def cmd_migrate(args: argparse.Namespace) -> int:
    """``outbox-relay migrate``."""
    from relay.store.adapters import create_roles, migrate

    dsn, table = database(args)
    layout = table_layout(args)
    _, slot = source_and_slot(args)
    if slot is not None and dsn.startswith(("mysql", "mariadb")):
        raise ConfigError("--source log needs PostgreSQL")
    if slot is not None:
        from relay.sources.log.publication import check_server

        check_server(dsn)  # before the table: a server that cannot decode gets nothing
    if args.create_roles and layout.debezium:
        raise ConfigError("--create-roles is not available with --table-layout debezium yet")
    if args.create_roles and args.relay_role == args.writer_role:
        # One role with both grants would let writers change the relay's columns, and the relay insert events.
        raise ConfigError(f"--relay-role and --writer-role must differ (both are {args.relay_role!r})")
    applied = migrate(dsn, table, notify=args.notify, layout=layout)
    print(f"{table}: applied {', '.join(map(str, applied))}" if applied else f"{table}: up to date")
    if args.create_roles:
        create_roles(dsn, table, relay_role=args.relay_role, writer_role=args.writer_role, log_source=slot is not None)
        print(f"{table}: roles {args.relay_role} (relay) and {args.writer_role} (writer) granted")
    if slot is not None:
        from relay.sources.log.publication import prepare

        created = prepare(dsn, table, slot, layout=layout)
        print(f"{table}: {', '.join(created)} created" if created else f"{table}: publication and slot {slot} ready")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``outbox-relay run``."""
    from relay.app import RunConfig, serve, tune_collector

    dsn, table = database(args)
    source, slot = source_and_slot(args)
    settings = RelaySettings(
        batch_size=args.batch_size,
        batch_bytes=args.batch_bytes,
        max_attempts=args.max_attempts,
        backoff_initial_seconds=args.backoff_initial,
        backoff_max_seconds=args.backoff_max,
        lease_seconds=args.lease_seconds,
        publish_timeout_seconds=args.publish_timeout,
        # A longest wait below the first one caps it: "never wait longer than this" (docs/mysql.md).
        poll_interval_seconds=min(args.poll_interval, args.poll_interval_max) or args.poll_interval,
        poll_interval_max_seconds=args.poll_interval_max,
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
        retention_seconds=args.retention,
        # Empty (a template that filled in nothing) is unset, as for the database URL: never every interface.
        metrics_host=args.metrics_host.strip() or DEFAULT_METRICS_HOST,
        metrics_port=args.metrics_port,
        startup_timeout_seconds=args.startup_timeout,
        event_source=args.event_source,
        layout=table_layout(args),
        source_kind=source,
        slot=slot,
    )
    tune_collector()
    asyncio.run(serve(run_config))
    return 0
