"""A key's order across the batches a sink has in flight: the part every sink that chains keys shares.

A sink with ``chains_keys`` may have several ``publish`` calls in flight with
events of one key (see :mod:`relay.holds` for why, and when an event is
``chained``). Three rules keep the key in order; :class:`Turns` (one per
``publish`` call) and :class:`KeyOrder` (one per sink) keep them:

- **Admit as it goes out.** Each event is admitted by the holds as it is
  handed to the broker, in call order; one that is not is answered
  :data:`relay.events.HELD` and never sent (:meth:`Turns.admit`).
- **Hold before wake.** An event that will not be acknowledged holds its key
  as soon as that is known (:meth:`Turns.hold`), and before anything waiting
  on it is woken (:meth:`Turns.settle`). A call that ends without an outcome
  for some events (it raised, was cancelled, or a path forgot them) holds
  their keys and wakes what waits on them as not acknowledged
  (:meth:`Turns.end`).
- **Tails before the first await.** A call takes its place among the calls in
  flight before it awaits anything (:meth:`KeyOrder.entered`): each key's last
  event in it becomes the key's *tail*, and each key's first event in it
  learns the tail it goes after (:attr:`Turns.before`), in the order the calls
  were made. A waiter is a plain callback (:meth:`Turns.follow`), never a
  future shared between calls: one call's timeout or cancellation cannot
  cancel what another waits on.

What each sink adds:

- *memory* (and the contract suite's throwaway kind): nothing; it admits and
  holds as it goes, synchronously.
- *Kafka*: no waiting. One produce thread hands the calls over in call order
  and the idempotent producer keeps a partition's order with requests in
  flight, so it uses admit and hold only (from its produce and delivery
  threads: :class:`~relay.holds.KeyHolds` is thread-safe), plus its own check
  that a chained event goes to its predecessor's topic (one partition).
- *RabbitMQ*: a key has one unconfirmed message. Its first event in a call
  follows the key's tail (:attr:`Turns.before`), each next one in the call the
  one before (:mod:`relay.sinks.rabbitmq.batch`); an event the broker may have
  refused (a suspect) becomes final only once cleared or convicted.

A new sink that cannot rely on the broker to keep a key's pipelined messages
in order does as RabbitMQ: enter its calls, send a key's first event once
the event in ``before`` is final, and settle each event as its outcome comes.
Everything but ``admit`` and ``hold`` runs on the event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence

from relay.events import Event
from relay.holds import KeyHolds

#: What a follower is told once the event it follows is final: whether it was acknowledged.
Follower = Callable[[bool], None]


class Turns:
    """One ``publish`` call's events, as their keys' order sees them."""

    __slots__ = ("_final", "_followers", "_lasts", "before", "events", "holds")

    def __init__(self, events: Sequence[Event], holds: KeyHolds | None) -> None:
        self.events = events
        #: None: the caller keeps no holds (order within the call only).
        self.holds = holds
        #: Each key's first event here -> the key's tail in the calls entered before, (their turns,
        #: its index), where that was not final yet when this call was entered (see KeyOrder).
        self.before: dict[int, tuple[Turns, int]] = {}
        #: The events that are final: acknowledged (True) or not.
        self._final: dict[int, bool] = {}
        self._followers: dict[int, list[Follower]] = {}
        #: Each key's last event here: the tails this call took (KeyOrder).
        self._lasts: dict[str, int] = {}

    def admit(self, index: int) -> bool:
        """Whether event ``index`` may go to the broker now; False: answer it ``HELD``, do not send it."""
        return self.holds is None or self.holds.admit(self.events[index])

    def hold(self, indices: Iterable[int]) -> None:
        """Hold the keys of events ``indices``: none of them will be acknowledged."""
        if self.holds is not None:
            self.holds.hold(self.events[i] for i in indices)

    def final(self, index: int) -> bool:
        """Whether event ``index`` has its last outcome."""
        return index in self._final

    def settle(self, index: int, *, acknowledged: bool) -> None:
        """Event ``index`` is final: unless acknowledged its key is held, then its followers are told."""
        if not acknowledged:
            self.hold((index,))
        if index in self._final:
            return
        self._final[index] = acknowledged
        if self._followers:
            for follower in self._followers.pop(index, ()):
                follower(acknowledged)

    def follow(self, index: int, follower: Follower) -> None:
        """Call ``follower(acknowledged)`` once event ``index`` is final (now, if it is)."""
        if index in self._final:
            follower(self._final[index])
        else:
            self._followers.setdefault(index, []).append(follower)

    def end(self) -> None:
        """The call ends: every event not final yet is settled not acknowledged (its key held first)."""
        if len(self._final) == len(self.events):
            return
        left = [i for i in range(len(self.events)) if i not in self._final]
        self.hold(left)
        self._final.update(dict.fromkeys(left, False))
        followers, self._followers = self._followers, {}
        for index in left:
            for follower in followers.pop(index, ()):
                follower(False)


class KeyOrder:
    """One sink's tails: per key, its last event in a ``publish`` call still under way."""

    def __init__(self) -> None:
        self._tails: dict[str, tuple[Turns, int]] = {}

    def enter(self, turns: Turns) -> None:
        """Give ``turns`` its place after the calls in flight: call it before the call's first await.

        Each key's first event in it learns the key's tail (``turns.before``),
        unless that is final already; each key's last event in it becomes the tail."""
        tails, lasts, before = self._tails, turns._lasts, turns.before
        for index, event in enumerate(turns.events):
            key = event.key
            if key is None:
                continue
            if key not in lasts:  # the key's first event here follows its tail, unless that is final
                tail = tails.get(key)
                if tail is not None and not tail[0].final(tail[1]):
                    before[index] = tail
            lasts[key] = index
        tails.update((key, (turns, index)) for key, index in lasts.items())

    def leave(self, turns: Turns) -> None:
        """The call of ``turns`` is over: its unfinished events are ended (:meth:`Turns.end`), its tails removed."""
        turns.end()
        for key, index in turns._lasts.items():
            if self._tails.get(key) == (turns, index):
                del self._tails[key]

    @contextlib.contextmanager
    def entered(self, turns: Turns) -> Iterator[Turns]:
        """``turns`` entered (:meth:`enter`) for the ``with`` block, and left (:meth:`leave`) on the way out."""
        self.enter(turns)
        try:
            yield turns
        finally:
            self.leave(turns)

    def tail(self, key: str) -> tuple[Turns, int] | None:
        """The last event of ``key`` in a call under way (for tests and logs)."""
        return self._tails.get(key)
