"""Flags with an environment fallback: the CLI's toolkit.

The environment is read here and nowhere else: every flag falls back to
``RELAY_<FLAG>`` (and the database URL to ``DATABASE_URL``), and its help
names the variable.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from relay.cli.streams import as_utf8
from relay.config import parse_duration
from relay.errors import ConfigError

PROG = "outbox-relay"
N = TypeVar("N")


def env_name(flag: str) -> str:
    """``--batch-size`` -> ``RELAY_BATCH_SIZE``."""
    return "RELAY_" + flag.lstrip("-").replace("-", "_").upper()


#: Every variable a flag reads (filled in as the parser is built).
_READ: set[str] = set()


def env_value(flag: str) -> str | None:
    """The variable behind ``flag``, if set (``--database-url`` also reads ``DATABASE_URL``)."""
    _READ.add(env_name(flag))
    value = os.environ.get(env_name(flag))
    if not value and flag == "--database-url":
        # An empty RELAY_DATABASE_URL (a template that filled in nothing) does not hide DATABASE_URL.
        value = os.environ.get("DATABASE_URL") or value
    return None if value is None else as_utf8(value)


def _parsed(text: str, convert: Callable[[str], N], what: str) -> N:
    # int() and float() also read other scripts' digits (an Arabic-Indic 7, a fullwidth 5) and
    # Python's underscores (1_000), which event ids, durations and URLs' ports all refuse: so here.
    if not text.isascii() or "_" in text:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what} in ASCII digits")
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


#: The largest whole number a flag takes: the databases' bigint (ids, limits).
MAX_INT = 2**63 - 1


#: The smallest id an event can have: plain SQL may write any bigint, 0 and below included.
MIN_INT = -(2**63)


def event_id(text: str) -> int:
    """An event's id: any bigint, written in ASCII digits (an id below 1 is as real as any)."""
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an event id (a whole number)")
    value = int(text)
    if not MIN_INT <= value <= MAX_INT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is no event id (ids run from {MIN_INT} to {MAX_INT})")
    return value


def positive_int(text: str) -> int:
    """A whole number, at least 1 and at most :data:`MAX_INT`."""
    value = _parsed(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    if value > MAX_INT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is too large (at most {MAX_INT})")
    return value


#: The most topics ``status --topics`` shows: its output stays a screenful or two, and its query's sort small.
MAX_STATUS_TOPICS = 1000


def shown_topics(text: str) -> int:
    """How many topics ``status`` shows: a whole number from 0 (none) to :data:`MAX_STATUS_TOPICS`."""
    value = _parsed(text, int, "a whole number")
    if not 0 <= value <= MAX_STATUS_TOPICS:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be from 0 to {MAX_STATUS_TOPICS}")
    return value


#: The longest any duration flag may be: a hundred years. Past that, "now" plus it leaves the
#: databases' timestamp ranges (a retry's deliver_at, a lease's end) and the relay stops on it.
MAX_SECONDS = 100 * 365.25 * 24 * 3600


def seconds(text: str) -> float:
    """A number of seconds, not negative, finite, and at most :data:`MAX_SECONDS`."""
    value = _parsed(text, float, "a number of seconds")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is more than a hundred years ({MAX_SECONDS:.0f} seconds)")
    return value


def duration(text: str) -> float | None:
    """Seconds in a duration such as ``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w``; empty
    (a template that filled in nothing) is unset (None). A refused one is an error naming its flag."""
    if not text:
        return None
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port(text: str) -> int:
    """A TCP port number (0 picks a free one)."""
    value = _parsed(text, int, "a port number")
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number")
    return value


#: How a time flag is written: both forms, the same for every flag that asks for a time.
TIME_FORMS = "an ISO-8601 time (2026-01-31T12:00:00Z; UTC without a zone) or a duration ago (90s, 15m, 12h, 7d, 2w)"


def time_or_duration(text: str) -> datetime | float:
    """The one reading of every flag that asks for a time: an ISO-8601 time (without a zone, UTC)
    as an aware datetime, else a duration (``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w``) as seconds.
    A bare number is seconds unless it reads as a date (``20260131``)."""
    refused = argparse.ArgumentTypeError(f"invalid duration or time {text[:40]!r}: use {TIME_FORMS}, in ASCII digits")
    if not text.isascii():  # fromisoformat and float() also take other scripts' digits
        raise refused
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        pass
    else:
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        return parse_duration(text)
    except ConfigError:
        raise refused from None


def timestamp(text: str) -> datetime:
    """A time (``replay --since``, ``--until``): an ISO-8601 time, or a duration before now."""
    value = time_or_duration(text)
    if isinstance(value, datetime):
        return value
    return datetime.now(UTC) - timedelta(seconds=value)


def age(text: str) -> float | None:
    """How old (``purge --older-than``): a duration, or an ISO-8601 time, as the seconds since it; empty
    (a template that filled in nothing) is unset (None). A time ahead of now is refused."""
    if not text:
        return None
    value = time_or_duration(text)
    if not isinstance(value, datetime):
        return value
    try:
        seconds = (datetime.now(UTC) - value).total_seconds()
    except OverflowError:  # year 1 minus the zone's offset
        seconds = MAX_SECONDS
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is ahead of now: nothing was written after it yet")
    return min(seconds, MAX_SECONDS)


def key_hex(text: str) -> str:
    """A key given as the hex of its bytes (``--key-hex``, as ``dead`` shows ``key_hex=``): the key as
    the stores hold it, bytes that are not UTF-8 as lone surrogates (a MySQL ``VARBINARY`` key's)."""
    try:
        raw = bytes.fromhex(text) if text.isascii() else None
    except ValueError:
        raw = None
    if raw is None:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not hex (two digits 0-9, a-f per byte, e.g. e9ff)")
    return raw.decode("utf-8", "surrogateescape")


class Once(argparse.Action):
    """A selection flag (``--id``, ``--key``, ...) given once: a second value is refused, not
    silently kept in place of the first (``requeue --id 3 --id 10`` requeued only 10)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} is given twice: select by one value (run the command again for another)")
        setattr(namespace, self.dest, values)


class KeyOnce(Once):
    """The key selector, given once, in either of its spellings: ``--key TEXT``, or ``--key-hex HEX``
    for a key shown as ``key_hex=`` (:func:`key_hex`). One selector, so one action: both set ``key``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string == "--key-hex":
            try:
                values = key_hex(values)
            except argparse.ArgumentTypeError as exc:
                parser.error(f"argument --key-hex: {exc}")
        super().__call__(parser, namespace, values, option_string)


#: The longest role name PostgreSQL keeps whole (it cuts longer ones at 63 bytes without a word).
MAX_ROLE_NAME_BYTES = 63


def role_name(text: str) -> str:
    """A role name for ``migrate --create-roles``: one both databases take as it is."""
    if not text:
        raise argparse.ArgumentTypeError("a role name cannot be empty")
    if len(text.encode("utf-8", "surrogateescape")) > MAX_ROLE_NAME_BYTES:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}... is longer than {MAX_ROLE_NAME_BYTES} bytes")
    if "`" in text or not text.isprintable():  # (NUL and every control character are not printable)
        raise argparse.ArgumentTypeError(f"{text[:40]!r} holds a backtick, NUL or control character")
    return text


def topic(text: str) -> str:
    """A topic to select events by: never empty, as no event's topic is (the table refuses one)."""
    if not text:
        raise argparse.ArgumentTypeError("no event has an empty topic")
    return text


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switched_on(text: str) -> bool | None:
    """How a switch reads its variable: ``1``, ``true``, ``yes`` or ``on`` (any case) is on, ``0``,
    ``false``, ``no`` or ``off`` off, an empty one unset (None); anything else is refused."""
    value = text.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if not value:
        return None
    raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a switch: use 1 or 0, true or false, yes or no, on or off")


def switch_default(parser: argparse.ArgumentParser, env: str, raw: str | None, default: Any) -> Any:
    """A switch's default from its variable ``env`` (``raw``): a refused value fails the command that uses it."""
    if raw is None:
        return default
    try:
        value = switched_on(raw)
    except argparse.ArgumentTypeError as exc:
        return _BadEnv(parser, f"{PROG}: error: {env}: {exc}")
    return default if value is None else value


def add_env_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    env: str,
    raw: str | None,
    prog: str,
    help: str,
    type: Callable[[str], Any] = str,
    default: Any = None,
    metavar: str | None = None,
    show_default: bool = True,
) -> None:
    """Add ``flag``; ``raw``, the value of variable ``env`` when set, replaces the default.

    A value the flag's ``type`` refuses ends the program with a one-line error
    naming the variable (:func:`reject_bad_env`), but only when the command
    that has the flag runs: ``--help`` and other commands still work. The help
    names the variable (and the default, unless ``show_default`` is off, as for
    URLs that may hold a password).
    """
    if raw is not None:
        try:
            default = type(raw)
        except argparse.ArgumentTypeError as exc:
            default = _BadEnv(parser, f"{prog}: error: {env}: {exc}")
    shown = f" (default: {default})" if show_default and default is not None else ""
    parser.add_argument(flag, type=type, default=default, metavar=metavar, help=f"{help} [env {env}]{shown}")


class _BadEnv:
    """The default of a flag whose variable holds a value the flag refuses."""

    def __init__(self, parser: argparse.ArgumentParser, error: str) -> None:
        self.parser = parser
        self.error = error

    def __str__(self) -> str:
        return "invalid"


def reject_bad_env(args: argparse.Namespace) -> None:
    """End with the one-line error of the first refused variable the parsed command uses."""
    for value in vars(args).values():
        if isinstance(value, _BadEnv):
            value.parser.exit(2, f"{value.error}\n")


def env_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    type: Callable[[str], Any] = str,
    default: Any = None,
    metavar: str | None = None,
) -> None:
    """Add ``flag`` with its ``RELAY_*`` fallback named in the help."""
    add_env_flag(
        parser, flag, env=env_name(flag), raw=env_value(flag), prog=PROG, help=help, type=type, default=default,
        metavar=metavar, show_default=flag not in ("--database-url", "--sink"),
    )  # fmt: skip


def env_switch(parser: argparse.ArgumentParser, flag: str, *, help: str, default: bool) -> None:
    """Add ``--flag``/``--no-flag`` with its ``RELAY_*`` fallback named in the help."""
    default = switch_default(parser, env_name(flag), env_value(flag), default)
    parser.add_argument(
        flag, action=argparse.BooleanOptionalAction, default=default, help=f"{help} [env {env_name(flag)}]"
    )


class RouteList(argparse.Action):
    """Collect ``--route`` values in order; the first one given replaces ``RELAY_ROUTES``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        routes = [] if current is None or current is self.default else list(current)
        routes.append(values)
        setattr(namespace, self.dest, routes)


def misspelt_env() -> list[str]:
    """Warnings for set ``RELAY_*`` variables that no flag reads but that look like one that does:
    such a setting is silently without effect otherwise. Call it once the parser is built. Other
    ``RELAY_*`` names may be another program's: only those near a read one are named."""
    warnings = []
    for name in sorted(n for n in os.environ if n.upper().startswith("RELAY_") and n not in _READ):
        meant = _meant(name)
        if meant:
            warnings.append(f"{PROG}: warning: {name} is not read (did you mean {meant}?); it has no effect")
    return warnings


def _meant(name: str) -> str | None:
    """The variable a flag reads that ``name`` was probably meant to be: the same in other case
    (``relay_sink``), with a word more or less at the end (``RELAY_PUBLISH_TIMEOUT_SECONDS``, as the
    settings' constants are named; ``RELAY_SINK_URL``; ``RELAY_LEASE``), or a near spelling
    (``RELAY_ROUTE`` for ``RELAY_ROUTES``)."""
    upper = name.upper()
    if upper in _READ:
        return upper
    longer_or_shorter = sorted(r for r in _READ if upper.startswith(r + "_") or r.startswith(upper + "_"))
    if longer_or_shorter:
        return difflib.get_close_matches(upper, longer_or_shorter, n=1, cutoff=0.0)[0]
    near = difflib.get_close_matches(upper, sorted(_READ), n=1, cutoff=0.9)
    return near[0] if near else None
