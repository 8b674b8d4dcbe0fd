"""A sink over several sinks: each topic goes to the first route whose pattern matches.

Each sink keeps its own outage state. When one raises ``SinkUnavailable`` it is
marked down: its events come back as ``unavailable`` outcomes (the relay gives
them back without spending an attempt, due again when the sink is next tried),
it is not called while down, and a probe task tries it again after an outage
backoff of its own. The other sinks go on publishing meanwhile. Only when every
sink is down does ``publish`` raise ``SinkUnavailable`` itself, so the relay
backs off as it does with one broker.

Events of one key never overtake each other across sinks: a key's events in
flight at once all go to one topic, so to one sink; a held-back event stays the
oldest unsent event of its key, so the later ones wait in the table, and the
keys of a share that is not tried are held (see docs/ordering.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from relay.backoff import OUTAGE_BACKOFF_INITIAL_SECONDS, OUTAGE_BACKOFF_MAX_SECONDS, OutageBackoff
from relay.errors import SinkUnavailable
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.sinks.base import Sink

logger = logging.getLogger(__name__)

#: Events of a down sink come due this long after its next probe starts, so the
#: probe has usually finished (and the sink is back) when they are claimed again.
RECHECK_MARGIN_SECONDS = 1.0
#: Topics whose route is remembered; the cache starts afresh when it is full.
ROUTE_CACHE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Route:
    """Events whose topic matches ``pattern`` (an :func:`fnmatch.fnmatchcase` glob) go to ``sink``.

    ``label`` names the sink in logs, errors and metrics and must hold no
    secret (a redacted URL). Routes that share a sink object share its state.
    """

    pattern: str
    sink: Sink
    label: str


@dataclass(eq=False, slots=True)
class _Target:
    """One sink behind the router and its outage state."""

    sink: Sink
    label: str
    backoff: OutageBackoff
    started: bool = False
    down: bool = False
    error: str = ""
    next_try: float = 0.0
    probe: asyncio.Task[None] | None = None


class RoutingSink:
    """Routes each event to one of several sinks by topic, first matching route first.

    A topic that matches no route gets a permanent failure ("no route for
    topic"), so its event is dead-lettered at once where an operator sees it,
    and can requeue it once a route covers the topic.
    """

    def __init__(
        self,
        routes: Sequence[Route],
        *,
        outage_initial_seconds: float = OUTAGE_BACKOFF_INITIAL_SECONDS,
        outage_max_seconds: float = OUTAGE_BACKOFF_MAX_SECONDS,
        recheck_margin_seconds: float = RECHECK_MARGIN_SECONDS,
    ) -> None:
        if not routes:
            raise ValueError("a routing sink needs at least one route")
        targets: dict[int, _Target] = {}
        self._routes: list[tuple[str, _Target]] = []
        for route in routes:
            if id(route.sink) not in targets:
                backoff = OutageBackoff(outage_initial_seconds, outage_max_seconds)
                targets[id(route.sink)] = _Target(route.sink, route.label, backoff)
            self._routes.append((route.pattern, targets[id(route.sink)]))
        self._recheck_margin = recheck_margin_seconds
        self._targets = list(targets.values())
        self._cache: dict[str, _Target | None] = {}
        self._crash: BaseException | None = None
        self._closed = False
        self.name = "+".join(sorted({t.sink.name for t in self._targets}))
        self.chains_keys = all(t.sink.chains_keys for t in self._targets)

    def __repr__(self) -> str:
        shown = ", ".join(f"{pattern!r}: {target.label!r}" for pattern, target in self._routes)
        return f"RoutingSink({{{shown}}})"

    def route(self, topic: str) -> str | None:
        """The label of the sink ``topic`` goes to, or None when no route matches."""
        target = self._target(topic)
        return target.label if target else None

    def states(self) -> dict[str, bool]:
        """Each sink's label and whether it is up: started, and not marked down since (a sink
        still starting, or down at start-up and not yet reached, is not up)."""
        return {t.label: t.started and not t.down for t in self._targets}

    def down(self) -> dict[str, str]:
        """The sinks marked down, with the error that put them there."""
        return {t.label: t.error for t in self._targets if t.down}

    async def start(self) -> None:
        """Start every sink at once; raise ``SinkUnavailable`` only if none can be reached.

        A sink that cannot be reached is marked down and tried again in the
        background; any other error (a refused login, say) is raised.
        """
        self._raise_crash()
        # A sink being probed is left to its probe: two starts at once could race.
        todo = [t for t in self._targets if t.probe is None or t.probe.done()]
        for target in await self._reachable(todo, lambda sink: sink.start()):
            target.started = True
            self._mark_up(target)
        self._raise_if_all_down()

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        """Publish each route's share of ``events`` concurrently; outcomes in the order given."""
        self._raise_crash()
        outcomes: list[Outcome] = [None] * len(events)
        shares: dict[_Target, list[int]] = {}
        unrouted = False
        for index, event in enumerate(events):
            target = self._target(event.topic)
            if target is None:
                unrouted = True
                outcomes[index] = Failure(f"no route for topic {event.topic!r}", permanent=True)
                if holds is not None:
                    holds.hold([event])
            else:
                shares.setdefault(target, []).append(index)
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(self._publish_share(t, [events[i] for i in indices], loop, holds) for t, indices in shares.items()),
            return_exceptions=True,
        )
        for (target, indices), result in zip(shares.items(), results, strict=True):
            if isinstance(result, BaseException):
                # Raised only once every share has finished, so none is cut off mid-publish.
                raise result
            if len(result) != len(indices):
                raise RuntimeError(f"sink {target.label} returned {len(result)} outcomes for {len(indices)} events")
            for index, outcome in zip(indices, result, strict=True):
                outcomes[index] = outcome
        if not unrouted and all(o is not None and o.unavailable for o in outcomes):
            # Nothing was delivered: let the relay back off as with one broker.
            self._raise_if_all_down()
        return outcomes

    async def check(self) -> None:
        """Check the sinks that are up; raise ``SinkUnavailable`` only if every sink is down.

        ``down()`` then names the sinks that are down; readiness uses it.
        """
        self._raise_crash()
        await self._reachable([t for t in self._targets if not t.down], lambda sink: sink.check())
        self._raise_if_all_down()

    async def close(self) -> None:
        """Stop the probes and close every sink. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        probes = [t.probe for t in self._targets if t.probe is not None]
        for probe in probes:
            probe.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        results = await asyncio.gather(*(t.sink.close() for t in self._targets), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _reachable(self, targets: list[_Target], call: Callable[[Sink], Awaitable[None]]) -> list[_Target]:
        """Run ``call`` on every target's sink at once; mark the unreachable down, return the others.

        Any error other than ``SinkUnavailable`` (a refused login, say) is raised.
        """
        results = await asyncio.gather(*(call(t.sink) for t in targets), return_exceptions=True)
        reached = []
        for target, result in zip(targets, results, strict=True):
            if isinstance(result, SinkUnavailable):
                self._mark_down(target, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                reached.append(target)
        return reached

    def _target(self, topic: str) -> _Target | None:
        try:
            return self._cache[topic]
        except KeyError:
            pass
        found = next((target for pattern, target in self._routes if fnmatchcase(topic, pattern)), None)
        if len(self._cache) >= ROUTE_CACHE_SIZE:
            self._cache.clear()
        self._cache[topic] = found
        return found

    async def _publish_share(
        self, target: _Target, events: list[Event], loop: asyncio.AbstractEventLoop, holds: KeyHolds | None
    ) -> list[Outcome]:
        if not target.down:
            try:
                return await target.sink.publish(events, holds)
            except SinkUnavailable as exc:
                self._mark_down(target, exc)
        if holds is not None:
            holds.hold(events)
        held = Failure(
            f"sink {target.label} unavailable: {target.error}",
            unavailable=True,
            retry_after_seconds=max(0.0, target.next_try - loop.time()) + self._recheck_margin,
        )
        return [held] * len(events)

    def _mark_down(self, target: _Target, exc: SinkUnavailable) -> None:
        target.error = " ".join(str(exc).split()) or type(exc).__name__
        if target.down:
            return
        target.down = True
        target.next_try = asyncio.get_running_loop().time() + target.backoff.next_delay()
        logger.warning(
            "sink %s unavailable, holding back its events: %s",
            target.label,
            target.error,
            extra={"action": "route_down", "sink": target.label},
        )
        if not self._closed and (target.probe is None or target.probe.done()):
            target.probe = asyncio.create_task(self._probe(target), name=f"probe {target.label}")
            target.probe.add_done_callback(self._probe_ended)

    def _mark_up(self, target: _Target) -> None:
        if target.down:
            logger.info("sink %s reachable again", target.label, extra={"action": "route_up", "sink": target.label})
        target.down = False
        target.error = ""
        target.backoff.reset()

    async def _probe(self, target: _Target) -> None:
        """Try a down sink again after each backoff delay until it answers."""
        loop = asyncio.get_running_loop()
        while target.down:
            await asyncio.sleep(max(0.0, target.next_try - loop.time()))
            try:
                # A sink that never started (down at start-up) has nothing to check yet.
                await (target.sink.check() if target.started else target.sink.start())
            except SinkUnavailable as exc:
                target.error = " ".join(str(exc).split()) or type(exc).__name__
                target.next_try = loop.time() + target.backoff.next_delay()
                logger.info(
                    "sink %s still unavailable: %s",
                    target.label,
                    target.error,
                    extra={"action": "route_retry", "sink": target.label},
                )
                continue
            target.started = True
            self._mark_up(target)

    def _probe_ended(self, task: asyncio.Task[None]) -> None:
        # A probe that dies of anything but a down broker is a bug or a refusal
        # no retry fixes: the next publish raises it and stops the relay loudly.
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()

    def _raise_crash(self) -> None:
        if self._crash is not None:
            raise self._crash

    def _raise_if_all_down(self) -> None:
        if all(t.down for t in self._targets):
            causes = "; ".join(f"{t.label}: {t.error}" for t in self._targets)
            raise SinkUnavailable(f"every sink is down ({causes})")
