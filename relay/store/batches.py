"""Operators' changes to many events, a batch at a time: ``requeue``, ``replay`` and ``purge``.

One statement over a whole selection (two million dead letters after a missing
route) outlasts the statement timeout and changes nothing. A selection is
walked instead in id order, a batch of at most ``ADMIN_BATCH_SIZE`` events
each its own short transaction: an interrupted command has changed whole
batches only, and run again it takes the rest (what it changed no longer
matches). In id order, a key's requeued dead letters come back first to last,
each in its place (docs/ordering.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

#: The most events one batch of an operator's command changes (one short transaction each).
ADMIN_BATCH_SIZE = 1000

#: Told how many events each batch changed, once it is committed (the CLI's progress line).
Progress = Callable[[int], None]
#: The ids of the next batch of the selection: at most ``limit`` of them, in id order, each above
#: ``after`` (None: from the start).
Select = Callable[[int | None, int], Awaitable[list[int]]]
#: Change the events of one batch, in a transaction of its own; the ids it changed.
Change = Callable[[list[int]], Awaitable[list[int]]]


async def walk(
    select: Select,
    change: Change | None,
    *,
    batch_size: int = ADMIN_BATCH_SIZE,
    progress: Progress | None = None,
) -> list[int]:
    """Every batch of the selection, changed by ``change`` (``None``: a dry run, nothing changed); the ids.

    A batch's ``change`` checks again that each event still matches (another
    operator may have changed it since the select): what it changed is counted.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    done: list[int] = []
    after: int | None = None
    while True:
        chosen = await select(after, batch_size)
        if not chosen:
            return done
        changed = chosen if change is None else await change(chosen)
        done.extend(changed)
        if progress is not None:
            progress(len(changed))
        if len(chosen) < batch_size:
            return done
        after = chosen[-1]
