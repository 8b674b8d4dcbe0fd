"""``outbox-relay run`` with a ``null://`` sink: the relay with no broker at all.

It registers one more sink kind before the real CLI starts: a sink that
acknowledges every event its key's holds admit, at once, and keeps none of
them (the in-memory sink of the unit tests, emptied after each batch). A
drain to it is the relay's own work and its database's, with no broker
client and no broker on the machine's cores: beside the same drain to Kafka
it shows the broker's share (bench/mysql.py). A benchmark harness only:
nothing here ships in the relay.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from relay import cli
from relay.config import Format, SinkConfig
from relay.events import Event, Outcome
from relay.holds import KeyHolds
from relay.sinks.base import Sink
from relay.sinks.memory import MemorySink
from relay.sinks.registry import SINK_KINDS, SinkKind

SCHEME = "null"


@dataclass(frozen=True, slots=True)
class NullSinkConfig:
    """``null://`` (anything after the scheme is ignored)."""

    format: Format = Format.NATIVE


class NullSink(MemorySink):
    """Acknowledges what the holds admit and keeps nothing."""

    name = SCHEME

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        outcomes = await super().publish(events, holds)
        self.delivered.clear()
        self.attempted.clear()
        return outcomes


def _parse(_url: str) -> SinkConfig:
    return NullSinkConfig()


def _build(_config: SinkConfig, **_: object) -> Sink:
    return NullSink()


def main() -> int:
    SINK_KINDS.register(
        SinkKind(
            name=SCHEME,
            schemes=(SCHEME,),
            config_type=NullSinkConfig,
            parse=_parse,
            build=_build,
            grace_seconds=lambda: 0.0,
            refuses_header=lambda _name: None,
            binding_header=lambda _name: False,
        )
    )
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
