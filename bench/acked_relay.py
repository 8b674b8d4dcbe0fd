"""``outbox-relay run`` that also notes when the broker acknowledged each event.

S2's target is commit-to-acknowledgement, and only the relay sees the
acknowledgement: this runs the real CLI in its own process, as
:class:`bench.relayproc.RelayProcess` does, with the loop's judging step
wrapped to stamp each acknowledged event with ``time.monotonic()`` (one clock
for every process on the machine, so the writers' commit stamps compare with
it). The store's claim is wrapped too, stamping each event when its claim's
events are built (the loop starts a claim and builds its events apart), which
splits the latency into the database leg (commit to claimed) and the broker
leg (claimed to acknowledged). The stamps go to the JSON file
named by ``BENCH_ACK_LOG`` when the relay stops. A benchmark harness only:
nothing here ships in the relay.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from relay import cli
from relay.batch import Deliveries
from relay.events import Event, Outcome
from relay.store.base import Claim
from relay.store.postgres.store import _Leased

ACK_LOG_ENV = "BENCH_ACK_LOG"


def main() -> int:
    path = Path(os.environ[ACK_LOG_ENV])
    acked: dict[str, float] = {}
    claimed: dict[str, float] = {}
    judge = Deliveries.judge
    build = _Leased.events

    def stamping(self: Deliveries, events: Sequence[Event], outcomes: Sequence[Outcome]) -> object:
        now = time.monotonic()
        for event, outcome in zip(events, outcomes, strict=False):
            if outcome is None:
                acked.setdefault(event.idempotency_key, now)
        return judge(self, events, outcomes)

    async def stamped_events(self: _Leased) -> Claim:
        result = await build(self)
        now = time.monotonic()
        for event in result.events:
            claimed.setdefault(event.idempotency_key, now)
        return result

    Deliveries.judge = stamping  # type: ignore[method-assign,assignment]
    _Leased.events = stamped_events  # type: ignore[method-assign]
    try:
        return cli.main(sys.argv[1:])
    finally:
        path.write_text(json.dumps({"acked": acked, "claimed": claimed}))


if __name__ == "__main__":
    sys.exit(main())
