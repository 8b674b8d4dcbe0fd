"""``outbox-relay run`` that also notes when the broker acknowledged each event.

S2's target is commit-to-acknowledgement, and only the relay sees the
acknowledgement: this runs the real CLI in its own process, as
:class:`bench.relayproc.RelayProcess` does, with the loop's judging step
wrapped to stamp each acknowledged event with ``time.monotonic()`` (one clock
for every process on the machine, so the writers' commit stamps compare with
it). The stamps go to the JSON file named by ``BENCH_ACK_LOG`` when the relay
stops. A benchmark harness only: nothing here ships in the relay.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from relay import cli
from relay.events import Event, Outcome
from relay.loop import Relay

ACK_LOG_ENV = "BENCH_ACK_LOG"


def main() -> int:
    path = Path(os.environ[ACK_LOG_ENV])
    acked: dict[str, float] = {}
    judge = Relay._judge

    def stamping(self: Relay, events: Sequence[Event], outcomes: Sequence[Outcome]) -> object:
        now = time.monotonic()
        for event, outcome in zip(events, outcomes, strict=False):
            if outcome is None:
                acked.setdefault(event.idempotency_key, now)
        return judge(self, events, outcomes)

    Relay._judge = stamping  # type: ignore[method-assign,assignment]
    try:
        return cli.main(sys.argv[1:])
    finally:
        path.write_text(json.dumps(acked))


if __name__ == "__main__":
    sys.exit(main())
