"""The operator's commands: ``status``, ``dead``, ``requeue``, ``retry``, ``skip``, ``inspect``, ``purge``, ``replay``.

Each opens the store through the ``Admin`` port, runs one call, and closes it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from relay.cli.commands import database, table_layout
from relay.cli.flags import MAX_INT, PROG
from relay.config import MIN_PUBLISH_TIMEOUT_SECONDS
from relay.errors import ConfigError, RelayError
from relay.store import batches
from relay.store.base import (
    Admin,
    ReplayFilter,
    RequeueFilter,
    RetryFilter,
    Skipped,
    Status,
    is_retrying,
    key_bytes,
    undecodable,
)

T = TypeVar("T")
#: How long past ``--publish-timeout`` a relay's publish may still run: the sinks
#: wait a margin past the timeout for the last acknowledgements (Kafka: 5 s), and
#: a RabbitMQ channel takes a moment to close.
PUBLISH_OVERRUN_SECONDS = 10.0
#: How often a command that changes events in batches says on stderr how far it got.
PROGRESS_SECONDS = 2.0
#: The most ids a dry run's ``--json`` lists (the count is always whole).
DRY_RUN_IDS = 1000


def _admin(args: argparse.Namespace) -> Admin:
    from relay.store.adapters import build_admin

    dsn, table = database(args)
    return build_admin(dsn, table, table_layout(args))


async def _with_admin(args: argparse.Namespace, work: Callable[[Admin], Awaitable[T]]) -> T:
    admin = _admin(args)
    try:
        await admin.open()
        return await work(admin)
    finally:
        await admin.close()


def _on_admin(args: argparse.Namespace, call: Callable[[Admin], Awaitable[T]]) -> T:
    """Open the ``Admin`` port, await ``call(admin)``, close it: the commands' one way in."""
    return asyncio.run(_with_admin(args, call))


def cmd_status(args: argparse.Namespace) -> int:
    """``outbox-relay status``."""

    status = _on_admin(args, lambda admin: admin.status(topics=args.topics))
    slot = _slot_status(args)
    if args.json:
        print(json.dumps(status.as_dict() | ({"slot": slot} if slot is not None else {})))
        return 0
    print(
        f"pending: {status.pending}\nin flight: {status.in_flight}\nfailed: {status.failed}\n"
        f"retrying: {status.retrying}\n"
        f"parked keys: {status.parked_keys}\n"
        f"scheduled: {status.scheduled}\n"
        f"keys waiting on schedule: {status.keys_waiting_on_schedule}\n"
        f"oldest pending age: {status.oldest_pending_age_seconds:.1f}s"
    )
    if status.retrying_topics:
        shown = len(status.retrying_topics)
        more = f" (the {shown} with the oldest)" if shown < _retrying_topic_count(status) else ""
        print(f"\nretrying, not dead-lettered yet{more}: topic, events, oldest, first event and its last error")
        for t in status.retrying_topics:
            error = "(no error recorded)" if t.last_error is None else _printable(t.last_error)
            print(
                f"  {_printable(t.topic)}\t{t.retrying}\t{t.oldest_age_seconds:.1f}s\tevent {t.event_id}, "
                f"attempts={t.attempts}, next in {t.next_attempt_in_seconds:.1f}s\t{error}"
            )
        print(f"  ({PROG} inspect ID shows one; {PROG} retry --id ID or --topic T tries again now)")
    if status.topics:
        print(
            f"\npending by topic ({len(status.topics)} of {status.topic_count}, oldest first): "
            "topic, pending, oldest pending age"
        )
        for lag in status.topics:
            print(f"  {_printable(lag.topic)}\t{lag.pending}\t{lag.oldest_pending_age_seconds:.1f}s")
    if slot is not None:
        print("\n".join(f"slot {name}: {value}" for name, value in slot.items()))
    return 0


def _slot_status(args: argparse.Namespace) -> dict[str, object] | None:
    """With ``--slot`` (the log source): the slot's lag, ``wal_status`` and reader."""
    if not getattr(args, "slot", None):
        return None
    from relay.cli.commands import database
    from relay.sources.log.slot import slot_status

    return slot_status(database(args)[0], args.slot)


def _retrying_topic_count(status: Status) -> int:
    """At least how many topics have retrying events: more than shown when their events add up to less."""
    shown = len(status.retrying_topics)
    return shown + (1 if sum(t.retrying for t in status.retrying_topics) < status.retrying else 0)


def _printable(text: str | None) -> str:
    """``text`` with each character that is not printable escaped as Python writes it (``\\n``)."""
    if text is None or text.isprintable():
        return str(text)
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _json_value(value: object) -> object:
    """What ``inspect --json`` writes for a column JSON has no type for."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()  # the usual way to carry bytes in JSON (back with base64 -d)
    if isinstance(value, datetime):
        return value.isoformat()  # as dead --json writes times
    return str(value)  # a UUID; a time no datetime holds, as the database wrote it


def _inspected(value: object) -> str:
    """One column as ``inspect`` prints it: on one line, headers as JSON, bytes as PostgreSQL shows a bytea."""
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return _printable(None if value is None else str(value))


def shown_key(key: str) -> tuple[str, str]:
    """How ``dead`` and ``inspect`` show a key: ``("key", key)`` when it is printable text, which
    ``--key`` selects as shown; otherwise ``("key_hex", the hex of its bytes)``, which ``--key-hex``
    selects. Escaping it instead (``\\xe9``, ``\\n``) would show two keys the same way: bytes E9 and
    the four characters of the text ``\\xe9``."""
    if key.isprintable():  # (not a lone surrogate: bytes that are not UTF-8 never are)
        return "key", key
    return "key_hex", key_bytes(key).hex()


class Progress:
    """What a command changing events in batches has done so far, said on stderr every few seconds."""

    def __init__(self, done: str) -> None:
        self.done = done  # "requeued", "replayed", "purged", "would requeue"...
        self.count = 0
        self._said = time.monotonic()

    def __call__(self, count: int) -> None:
        """One more batch committed (or, in a dry run, looked at)."""
        self.count += count
        if time.monotonic() - self._said >= PROGRESS_SECONDS:
            print(f"{PROG}: {self.done} {self.count} events so far", file=sys.stderr, flush=True)
            self._said = time.monotonic()

    @contextmanager
    def reported(self) -> Iterator[None]:
        """On an error or an interrupt, say what was done before it: whole batches, each committed."""
        try:
            yield
        except (RelayError, KeyboardInterrupt) as exc:
            if self.count and not self.done.startswith("would"):
                stopped = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped by the error below"
                print(
                    f"{PROG}: {stopped} after {self.done} {self.count} events (whole batches, each committed); "
                    "the rest is unchanged: run the command again for it",
                    file=sys.stderr,
                )
            raise


def _dry_run_said(args: argparse.Namespace, verb: str, ids: list[int] | None, count: int) -> None:
    """What a ``--dry-run`` prints: how many events it would change and, with ``--json``, their first ids."""
    if args.json:
        said: dict[str, Any] = {"dry_run": True, f"would_{verb}": count}
        if ids is not None:
            said["ids"] = ids[:DRY_RUN_IDS]  # the first ones, in id order: the count says whether there are more
        print(json.dumps(said))
    else:
        print(f"would {verb} {count} events (dry run: nothing changed)")


def cmd_dead(args: argparse.Namespace) -> int:
    """``outbox-relay dead``."""

    # One more than asked for tells whether there are more.
    events = _on_admin(args, lambda admin: admin.dead(min(args.limit + 1, MAX_INT), topic=args.topic))
    if len(events) > args.limit:
        events = events[: args.limit]
        # stderr, so that --json stays one parsable document.
        print(f"{PROG}: showing the oldest {args.limit} dead letters; there are more (--limit)", file=sys.stderr)
    if args.json:
        print(json.dumps([e.as_dict() for e in events]))
        return 0
    if not events:
        print("no dead-lettered events" if args.topic is None else f"no dead-lettered events of topic {args.topic!r}")
    for e in events:
        blocks = f" blocks its key ({e.blocked_events} waiting)" if e.blocked_events else ""
        # One line per event: a newline or tab in an error or topic is shown escaped, a key that is not
        # printable in hex (shown_key). An event without a key says so (key=None would read as the key 'None').
        key = "no key" if e.key is None else "=".join(shown_key(e.key))
        # A row dead-lettered by hand may have no error: say so rather than print None.
        error = "(no error recorded)" if e.last_error is None else _printable(e.last_error)
        print(f"{e.id}\t{_printable(e.topic)}\t{key}\tattempts={e.attempts}{blocks}\t{error}")
    return 0


def cmd_requeue(args: argparse.Namespace) -> int:
    """``outbox-relay requeue``."""
    selection = RequeueFilter(id=args.id, topic=args.topic, key=args.key, all=args.all)
    progress = Progress("would requeue" if args.dry_run else "requeued")
    with progress.reported():
        ids = _on_admin(
            args,
            lambda admin: admin.requeue(
                selection, dry_run=args.dry_run, batch_size=batches.ADMIN_BATCH_SIZE, progress=progress
            ),
        )
    if args.id is not None and not ids:  # one event named, as skip: an operator's typo is no success
        if args.json:  # as skip --json: the ids it changed (none), the reason on stderr
            print(json.dumps({"dry_run": True, "would_requeue": 0, "ids": []} if args.dry_run else {"requeued": []}))
        print(f"{PROG}: error: event {args.id} is not dead-lettered (or does not exist)", file=sys.stderr)
        return 1
    if args.dry_run:
        _dry_run_said(args, "requeue", ids, len(ids))
    else:
        print(json.dumps({"requeued": ids}) if args.json else f"requeued {len(ids)} events")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    """``outbox-relay retry``."""
    selection = RetryFilter(id=args.id, topic=args.topic, all=args.all)

    ids = _on_admin(args, lambda admin: admin.retry_now(selection))
    missed = args.id is not None and not ids  # one event named, as requeue: an operator's typo is no success
    if args.json:  # as skip --json: the ids it changed (none when refused, with the reason on stderr)
        print(json.dumps({"retried": ids}))
    elif not missed:  # as skip: a refusal is said once, on stderr, not also as "0 events" on stdout
        print(f"made {len(ids)} retrying events due now")
    if missed:
        print(
            f"{PROG}: error: event {args.id} is not retrying: no such event, or not pending with a failed attempt, "
            f"or in flight now (a dead-lettered one goes back with {PROG} requeue --id {args.id})",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_skip(args: argparse.Namespace) -> int:
    """``outbox-relay skip``."""
    if args.publish_timeout < MIN_PUBLISH_TIMEOUT_SECONDS:  # as run refuses it: the same variable
        raise ConfigError(f"--publish-timeout must be at least {MIN_PUBLISH_TIMEOUT_SECONDS:g} s")
    grace = args.publish_timeout + PUBLISH_OVERRUN_SECONDS
    outcome = _on_admin(args, lambda admin: admin.skip(args.id, lease_grace_seconds=grace, dry_run=args.dry_run))
    skipped = [args.id] if outcome is Skipped.SKIPPED else []
    if args.dry_run and (args.json or skipped):
        _dry_run_said(args, "skip", skipped, len(skipped))
    elif args.json:  # as requeue --json: the ids it changed (none when refused, with the reason on stderr)
        print(json.dumps({"skipped": skipped}))
    elif skipped:
        print(f"skipped event {args.id}")
    if skipped:
        return 0
    if outcome is Skipped.IN_FLIGHT:
        problem = (
            f"event {args.id} may be in flight: a relay holds its lease, or the lease ended less than {grace:g}s ago "
            "(--publish-timeout plus a margin) and its publish may still be running; try again once it has been "
            "over that long"
        )
    else:
        problem = f"event {args.id} is not dead-lettered or waiting (or does not exist)"
    print(f"{PROG}: error: {problem}", file=sys.stderr)
    return 1


def cmd_inspect(args: argparse.Namespace) -> int:
    """``outbox-relay inspect``."""

    row = _on_admin(args, lambda admin: admin.inspect(args.id))
    if row is None:
        print(f"{PROG}: error: no event {args.id}", file=sys.stderr)
        return 1
    retrying = is_retrying(row, datetime.now(UTC))
    key = row.get("key")
    if args.json:
        # The key as text only when it is UTF-8 (JSON has no bytes), and always as the hex of its bytes.
        hex_ = None if key is None else key_bytes(key).hex()
        shown = {**row, "key": None if undecodable(key) else key, "key_hex": hex_, "retrying": retrying}
        print(json.dumps(shown, default=_json_value))
        return 0
    for name, value in row.items():
        if name == "key" and key is not None:
            print("{}: {}".format(*shown_key(key)))
        else:
            print(f"{name}: {_inspected(value)}")
    if retrying:
        due = row["deliver_at"]
        when = f"next attempt at {due.isoformat()}" if isinstance(due, datetime) else "next attempt when due"
        print(
            f"retrying: yes, {_attempts(row['attempts'])} so far, {when} "
            f"({PROG} retry --id {args.id} tries it now); last_error says why"
        )
    else:
        print("retrying: no")
    return 0


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


def cmd_purge(args: argparse.Namespace) -> int:
    """``outbox-relay purge``."""
    seconds: float | None = args.older_than
    if seconds is None:
        raise ConfigError("purge needs --older-than DURATION (or RELAY_OLDER_THAN)")

    progress = Progress("would purge" if args.dry_run else "purged")
    with progress.reported():
        deleted = _on_admin(
            args,
            lambda admin: admin.purge(
                seconds, dry_run=args.dry_run, batch_size=batches.ADMIN_BATCH_SIZE, progress=progress
            ),
        )
    if args.dry_run:
        _dry_run_said(args, "purge", None, deleted)
    else:
        print(json.dumps({"purged": deleted}) if args.json else f"purged {deleted} events")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """``outbox-relay replay``."""
    # An empty key is a key (publish() takes one): given, it selects, as with requeue.
    if not (args.all or args.since or args.until or args.key is not None or args.topic is not None):
        raise ConfigError("replay needs --since, --until, --key, --topic or --all")
    if args.since is not None and args.until is not None and args.until <= args.since:
        # No event was sent in an empty window: "replayed 0 events" would hide the swapped flags.
        raise ConfigError(
            f"--until {args.until.isoformat()} is not after --since {args.since.isoformat()}: no event was sent between"
        )

    selection = ReplayFilter(since=args.since, until=args.until, key=args.key, topic=args.topic, all=args.all)
    progress = Progress("would replay" if args.dry_run else "replayed")
    with progress.reported():
        ids = _on_admin(
            args,
            lambda admin: admin.replay(
                selection, dry_run=args.dry_run, batch_size=batches.ADMIN_BATCH_SIZE, progress=progress
            ),
        )
    if args.dry_run:
        _dry_run_said(args, "replay", ids, len(ids))
    else:
        print(json.dumps({"replayed": ids}) if args.json else f"replayed {len(ids)} events")
    return 0
