"""The composition root: builds the store, sink and relay from configuration."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
from dataclasses import dataclass

from relay.config import (
    NATIVE,
    Format,
    RelaySettings,
    RouteConfig,
    SinkConfig,
    TableLayout,
    TableName,
    check_event_source,
    default_event_source,
    redact_url,
)
from relay.errors import ConfigError, RelayError
from relay.health import HealthServer
from relay.loop import Relay
from relay.retention import purge_forever
from relay.signals import stop_on_signals
from relay.sinks import build_router, build_sink, header_refusal, publish_grace_seconds, sink_kind_name
from relay.sinks.base import Sink
from relay.sources.table import TableSource
from relay.store.adapters import build_store
from relay.store.base import Admin

logger = logging.getLogger(__name__)

#: The collector's youngest-generation threshold, in allocations (CPython's default is 700). A relay
#: builds a few objects per event that live until its batch is confirmed; at 700 most of them survive a
#: collection or two and are traversed again in the older generations before they die. At this threshold
#: most die young (the log relay's CPU per event 6-7% lower, docs/log-source.md). The relay makes no
#: cyclic garbage in volume, so the collections are rarer, not bigger in memory; the older generations'
#: thresholds stay.
GC_YOUNG_THRESHOLD = 20_000


def tune_collector() -> None:
    """Set the garbage collector for a relay process: ``run`` calls it once, before serving."""
    _young, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def owner_id() -> str:
    """Who holds a lease: host and process id, for operators reading the table."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything ``outbox-relay run`` needs, validated.

    With ``routes`` (``--sink``, if given, already appended as the catch-all
    ``*``) events go to a :class:`relay.sinks.RoutingSink` and ``sink`` is not
    used; without, every event goes to ``sink``.
    """

    database_url: str
    table: TableName
    sink: SinkConfig | None
    settings: RelaySettings
    keep_sent: bool = False
    retention_seconds: float | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    startup_timeout_seconds: float = 0.0
    routes: tuple[RouteConfig, ...] = ()
    #: The CloudEvents ``source`` (``--event-source``); None: :func:`relay.config.default_event_source`.
    event_source: str | None = None
    layout: TableLayout = NATIVE
    #: ``table`` (claims) or ``log`` (logical decoding through ``slot``): see :mod:`relay.sources`.
    source_kind: str = "table"
    slot: str | None = None

    def __post_init__(self) -> None:
        if self.source_kind == "log" and self.database_url.startswith(("mysql", "mariadb")):
            raise ConfigError("--source log needs PostgreSQL")
        if self.sink is None and not self.routes:
            raise ConfigError("no sink configured: set --sink or --route (RELAY_SINK, RELAY_ROUTES)")
        if self.event_source is not None:
            check_event_source(self.event_source)
            if all(config.format is Format.NATIVE for config in self._sinks()):
                # Set and silently unused would hide a sink URL that lost its format= option.
                raise ConfigError(
                    "--event-source (RELAY_EVENT_SOURCE) sets the CloudEvents source, but no sink"
                    " has format=cloudevents or format=cloudevents-structured"
                )
        for config in self._sinks():
            for column, header in self.layout.field_headers:
                if why := header_refusal(config, header):
                    where = f"for the {sink_kind_name(config)} sink"
                    raise ConfigError(f"invalid field header '{column}={header[:80]}' {where}: {why}")
        slowest = max(self._sinks(), key=publish_grace_seconds)
        self.settings.check_lease(publish_grace_seconds(slowest), sink_kind_name(slowest))

    def _sinks(self) -> list[SinkConfig]:
        if self.routes:
            return [route.sink for route in self.routes]
        return [self.sink] if self.sink else []

    @property
    def source(self) -> str:
        """The CloudEvents ``source`` of the events: ``--event-source``, or one naming the database and table."""
        if self.event_source is not None:
            return self.event_source
        return default_event_source(self.database_url, self.table)

    @property
    def publish_grace_seconds(self) -> float:
        """The longest any of the sinks may run past ``--publish-timeout``."""
        return max(map(publish_grace_seconds, self._sinks()))

    def __repr__(self) -> str:
        routes = ", ".join(f"{r.pattern!r}: {r.label!r}" for r in self.routes)
        return (
            f"RunConfig(database_url={redact_url(self.database_url)!r}, table={str(self.table)!r}, "
            f"sink={self.sink!r}, routes={{{routes}}}, settings={self.settings!r})"
        )

    def describe_sinks(self) -> str:
        """Where events go, for the start-up log line (no secrets)."""
        if self.routes:
            return ", ".join(f"{r.pattern} -> {_shape(r.sink)}" for r in self.routes)
        return _shape(self.sink) if self.sink else "nowhere"


def _shape(config: SinkConfig) -> str:
    """The kind of sink, with its format unless native: ``kafka (cloudevents)``."""
    kind = sink_kind_name(config)
    return kind if config.format is Format.NATIVE else f"{kind} ({config.format.value})"


def build_source_relay(config: RunConfig) -> Relay:
    """Wire the relay of ``config``'s source: the table's (:func:`build_relay`), or the log's (``--source log``)."""
    if config.source_kind == "log" and config.slot is not None:
        return _build_log_relay(config)
    return build_relay(config)


def build_relay(config: RunConfig) -> Relay:
    """Wire a table relay from ``config``."""
    store = build_store(
        config.database_url,
        config.table,
        owner=owner_id(),
        lease_seconds=config.settings.lease_seconds,
        keep_sent=config.keep_sent,
        listen=config.settings.listen,
        layout=config.layout,
    )
    # The table is the source the loop takes batches from; the store also keeps the gauges and the reaper.
    source = TableSource(store, max_attempts=config.settings.max_attempts)
    grace = config.publish_grace_seconds
    timeout = config.settings.publish_timeout_seconds
    if config.sink is not None and not config.routes:
        sink: Sink = build_sink(config.sink, publish_timeout_seconds=timeout, event_source=config.source)
        return Relay(store, sink, config.settings, publish_grace_seconds=grace, source=source)
    router = build_router(config.routes, publish_timeout_seconds=timeout, event_source=config.source)
    relay = Relay(store, router, config.settings, publish_grace_seconds=grace, source=source)
    relay.metrics.track_sinks(router.states)
    return relay


def _build_log_relay(config: RunConfig) -> Relay:
    from relay.log_relay import LogRelay

    timeout = config.settings.publish_timeout_seconds
    assert config.slot is not None
    sink: Sink
    if config.sink is not None and not config.routes:
        sink = build_sink(config.sink, publish_timeout_seconds=timeout, event_source=config.source)
    else:
        sink = build_router(config.routes, publish_timeout_seconds=timeout, event_source=config.source)
    return LogRelay(
        config.database_url,
        config.table,
        config.slot,
        sink,
        config.settings,
        publish_grace_seconds=config.publish_grace_seconds,
        layout=config.layout,
    )


async def start(relay: Relay, timeout: float, stop: asyncio.Event | None = None) -> bool:
    """Connect the store and the sink, trying for up to ``timeout`` seconds; False if stopped first.

    Past start-up the relay rides out outages; at start-up an unreachable
    server is more likely a configuration mistake, so it is reported. With
    routes, only when no sink answers: one broker down must not stop the
    others' events (its own events wait, and ``/readyz`` says so). A stop
    while waiting ends the wait: nothing is in hand yet.
    """
    stop = stop or asyncio.Event()
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await relay.open()
            return True
        except RelayError as exc:
            await relay.source.close()
            # A configuration mistake (a URL libpq refuses) stays one: no waiting mends it.
            if isinstance(exc, ConfigError):
                raise
            # Stopped while the attempt waited on a server that does not answer: a stop, not an error.
            if stop.is_set():
                return False
            if asyncio.get_running_loop().time() >= deadline:
                raise
            logger.warning("not started yet, trying again: %s", exc, extra={"action": "start_retry"})
            # Alive meanwhile (/healthz 200, /readyz 503): each try in relay.open() counts as a wait
            # on purpose for a call allowance, which outlasts this second's wait before the next.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if stop.is_set():
                return False


async def serve(config: RunConfig) -> None:
    """Run a relay until SIGTERM or SIGINT; return once the batches in hand are settled."""
    relay = build_source_relay(config)
    stop = asyncio.Event()
    with stop_on_signals(stop):
        health = None
        if config.metrics_port is not None:
            # Listen before connecting: a taken port fails at once, with nothing to close.
            # Once stopping, /readyz answers 503 while the batches in hand drain.
            health = HealthServer(relay, config.metrics_host, config.metrics_port, stopping=stop)
            await health.start()
        try:
            await _relay_until_stopped(relay, config, stop, health)
        finally:
            if health is not None:
                await health.close()
    logger.info("stopped", extra={"action": "stopped"})


async def _relay_until_stopped(
    relay: Relay, config: RunConfig, stop: asyncio.Event, health: HealthServer | None
) -> None:
    if not await start(relay, config.startup_timeout_seconds, stop):
        return
    if health is not None:
        health.started = True
    logger.info(
        "relaying %s to %s",
        config.table,
        config.describe_sinks(),
        extra={"action": "start", "batch_size": config.settings.batch_size},
    )
    side_tasks = []
    # What the table keeps, skipped events always and sent ones with --keep-sent, is purged once old.
    if config.retention_seconds is not None and isinstance(relay, Relay) and hasattr(relay.store, "purge"):
        admin: Admin = relay.store  # type: ignore[assignment]  # both database stores are also Admin
        side_tasks.append(asyncio.create_task(purge_forever(admin, config.retention_seconds, stop), name="retention"))
    for task in side_tasks:
        # A side task that dies of a bug stops the relay loudly.
        task.add_done_callback(lambda t: stop.set() if not t.cancelled() and t.exception() else None)
    try:
        await relay.run(stop)
    finally:
        stop.set()
        for task in side_tasks:
            await task
