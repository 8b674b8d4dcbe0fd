"""The log relay: the loop (:class:`relay.loop.Relay`) driving the log source (:mod:`relay.sources.log`).

The same loop, batch room and sinks as the table's; only the source differs
(:class:`relay.sources.log.source.LogSource`): no leases to reap and no table
gauges, and ``/healthz`` fails once the slot is gone.
"""

from __future__ import annotations

from relay.config import NATIVE, RelaySettings, TableLayout, TableName
from relay.loop import Relay
from relay.metrics import Metrics
from relay.sinks.base import Sink
from relay.sources.log.leader import LEADER_TIMEOUT_SECONDS, Leader, SlotState
from relay.sources.log.source import LogSource


class LogRelay(Relay):
    """Moves events from a logical replication slot to a sink until stopped."""

    def __init__(
        self,
        dsn: str,
        table: TableName,
        slot: str,
        sink: Sink,
        settings: RelaySettings,
        *,
        metrics: Metrics | None = None,
        publish_grace_seconds: float = 0.0,
        leader_timeout_seconds: float = LEADER_TIMEOUT_SECONDS,
        layout: TableLayout = NATIVE,
    ) -> None:
        metrics = metrics or Metrics()
        #: The slot as a source: its reader, window and confirm.
        self.log = LogSource(
            Leader(dsn, table, slot, sink, settings, metrics, publish_grace_seconds=publish_grace_seconds,
                   leader_timeout_seconds=leader_timeout_seconds, layout=layout)
        )  # fmt: skip
        super().__init__(None, sink, settings, metrics=metrics, publish_grace_seconds=publish_grace_seconds,
                         source=self.log)  # fmt: skip

    @property
    def state(self) -> SlotState:
        """The slot as last seen: for metrics, ``status`` and ``/healthz``."""
        return self.log.state

    def alive(self) -> bool:
        """True unless the loop is wedged (``/healthz``); False too once the slot is gone."""
        return self.state.gone is None and super().alive()
