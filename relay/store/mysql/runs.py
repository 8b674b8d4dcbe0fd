"""Which locked candidates a MySQL claim leases: the per-key runs, and the byte cap.

The PostgreSQL claim does this in its one statement (relay/store/queries.sql,
``claim``); MySQL has no ``UPDATE … RETURNING`` and no ``LATERAL``, so the
claim locks its candidates, reads its keys' unsent events, and decides here,
by the same rules (the memory store, relay/store/memory/store.py, is the readable
reference they all follow).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import NamedTuple

from relay.store import claims


class Candidate(NamedTuple):
    """A row the claim locked: due, unleased, and not parked behind its key's oldest event.

    (A named tuple: a claim makes thousands, and a frozen dataclass takes three times as long to make.)
    """

    id: int
    key: str | None
    topic: str
    priority: int
    bytes: int
    reaped: bool
    #: Whether it is its key's oldest unsent event, as the claim's snapshot saw it (False without a key).
    head: bool = False


@dataclass(frozen=True, slots=True)
class Unsent:
    """An unsent event of a candidate's key (pending or dead-lettered)."""

    id: int
    topic: str


@dataclass(frozen=True, slots=True)
class Tail:
    """This relay's last event in flight of a key it may go on with."""

    id: int
    topic: str


def lone_runs(
    candidates: Sequence[Candidate], tails: Mapping[str, Tail], flying: Set[int], after_tail: Mapping[int, int]
) -> dict[int, bool] | None:
    """What :func:`runs` chooses when no key has two candidates, with no read of the keys' unsent events;
    None when a key has two.

    A key's one candidate is a run of one if its key is not in ``tails`` and
    it is its key's ``head``, or if it is the first unsent event after its
    key's tail (``after_tail``, by the tail's id), that tail is ``flying``, and
    it goes to the tail's topic (chained). The common claim of a backlog of
    many keys (each in a batch at most once), of one key per event, or of none.
    """
    keys: set[str] = set()
    chosen: dict[int, bool] = {}
    for candidate in candidates:
        key = candidate.key
        if key is None:
            chosen[candidate.id] = False
            continue
        if key in keys:
            return None
        keys.add(key)
        tail = tails.get(key)
        if tail is None:
            if candidate.head:
                chosen[candidate.id] = False
        elif tail.id in flying and after_tail.get(tail.id) == candidate.id and candidate.topic == tail.topic:
            chosen[candidate.id] = True
    return chosen


def runs(
    candidates: Sequence[Candidate],
    unsent: Mapping[str, Sequence[Unsent]],
    tails: Mapping[str, Tail],
    flying: Set[int],
) -> dict[int, bool]:
    """The candidates that make up runs, each with whether it is chained.

    ``unsent`` holds each key's unsent events in id order (up to the last
    candidate, from its tail or its first candidate on at least), ``tails``
    the keys this relay may go on with, and ``flying`` the ids of those tails
    whose lease still holds. A key in flight here goes on after its tail, to
    the same topic only; any other key starts at its oldest unsent event,
    which must be a candidate and its key's head as the locking read saw it
    (``head``: the events before the first candidate may not be in
    ``unsent``). A run takes the key's candidates from there on, up to the
    first unsent event that is not a candidate or goes to another topic.
    Events without a key always go.
    """
    ids = {c.id for c in candidates}
    heads = {c.id for c in candidates if c.head}
    chosen: dict[int, bool] = {}
    for key in {c.key for c in candidates if c.key is not None}:
        events = unsent.get(key, ())
        tail = tails.get(key)
        if tail is None:
            after, chained = list(events[:1]), False
            if after and after[0].id not in heads:
                continue
        else:
            if tail.id not in flying:
                continue
            after, chained = [e for e in events if e.id > tail.id][:1], True
            if after and after[0].topic != tail.topic:
                continue
        if not after or after[0].id not in ids:
            continue
        head = after[0]
        start = next(i for i, e in enumerate(events) if e.id == head.id)
        for event in events[start:]:
            if event.id not in ids or event.topic != head.topic:
                break
            chosen[event.id] = chained or event.id > head.id
    for candidate in candidates:
        if candidate.key is None:
            chosen[candidate.id] = False
    return chosen


def within_bytes(placed: Sequence[Candidate], max_bytes: int | None) -> list[Candidate]:
    """The candidates of ``placed`` (in claim order) within ``max_bytes``: the rule every store shares
    (:func:`relay.store.claims.within_bytes`), counted in the sizes the locking read returned."""
    return claims.within_bytes(placed, max_bytes, size=lambda candidate: candidate.bytes)
