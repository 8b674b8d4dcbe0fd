"""The relay loop's tunables (:class:`RelaySettings`), their defaults with their units, and their checks.

What a lease must hold is checked here too (:meth:`RelaySettings.check_lease`),
once the sinks' grace is known. :func:`parse_duration` reads the durations the
CLI takes (``90s``, ``7d``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from relay.errors import ConfigError

BATCH_SIZE = 4000
MAX_ATTEMPTS = 10
BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0
LEASE_SECONDS = 60.0
PUBLISH_TIMEOUT_SECONDS = 30.0
#: Below this no broker acknowledges in time: every publish would time out and be repeated.
MIN_PUBLISH_TIMEOUT_SECONDS = 0.1
#: Where /metrics and the health endpoints listen unless told: this host only.
DEFAULT_METRICS_HOST = "127.0.0.1"
POLL_INTERVAL_SECONDS = 0.5
POLL_INTERVAL_MAX_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 10.0
PIPELINE_DEPTH = 2
#: A claim stops adding events once their payloads reach this many bytes (always at least one event).
BATCH_BYTES = 16 * 1024 * 1024
#: The least a lease must leave for the claim itself, before its batch is published.
CLAIM_RESERVE_SECONDS = 1.0
#: Kept at the end of a lease for the settle that records a batch's outcome (short statements).
SETTLE_RESERVE_SECONDS = 1.0


# ASCII digits only: \d would take any script's digits (an Arabic-Indic seven for 7).
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w``."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ConfigError(f"invalid duration {text[:40]!r}: use a number with s, m, h, d or w (e.g. 7d)")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds > MAX_DURATION_SECONDS:
        raise ConfigError(f"invalid duration {text[:40]!r}: more than a hundred years")
    return seconds


#: Past a hundred years, "now" minus or plus a duration leaves the databases' timestamp ranges.
MAX_DURATION_SECONDS = 100 * 365.25 * 24 * 3600


def _at_least(seconds: float) -> str:
    """``seconds`` rounded up to the millisecond and written out whole: advice that, followed, passes
    (``:g`` keeps six digits, and rounded 1234567.5 down)."""
    text = f"{math.ceil(seconds * 1000 - 1e-6) / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{text} s"


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """The tunables of the relay loop, each with its unit in the name."""

    batch_size: int = BATCH_SIZE
    batch_bytes: int = BATCH_BYTES
    max_attempts: int = MAX_ATTEMPTS
    backoff_initial_seconds: float = BACKOFF_INITIAL_SECONDS
    backoff_max_seconds: float = BACKOFF_MAX_SECONDS
    lease_seconds: float = LEASE_SECONDS
    publish_timeout_seconds: float = PUBLISH_TIMEOUT_SECONDS
    poll_interval_seconds: float = POLL_INTERVAL_SECONDS
    poll_interval_max_seconds: float = POLL_INTERVAL_MAX_SECONDS
    pipeline_depth: int = PIPELINE_DEPTH
    listen: bool = True

    def __post_init__(self) -> None:
        checks = [
            (self.batch_size >= 1, "--batch-size must be at least 1"),
            (self.batch_bytes >= 1, "--batch-bytes must be at least 1"),
            (self.max_attempts >= 1, "--max-attempts must be at least 1"),
            (self.backoff_initial_seconds > 0, "--backoff-initial must be positive"),
            (
                self.backoff_max_seconds >= self.backoff_initial_seconds,
                "--backoff-max must be >= --backoff-initial",
            ),
            (
                self.publish_timeout_seconds >= MIN_PUBLISH_TIMEOUT_SECONDS,
                f"--publish-timeout must be at least {MIN_PUBLISH_TIMEOUT_SECONDS:g} s: a shorter one times out "
                "every publish, and each repeat is a copy",
            ),
            (self.poll_interval_seconds > 0, "--poll-interval must be positive"),
            (self.poll_interval_max_seconds > 0, "--poll-interval-max must be positive"),
            (self.pipeline_depth >= 1, "pipeline depth must be at least 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        # The lease is checked where the sinks are known (RunConfig, check_lease): the grace of the
        # slowest is part of what a lease must hold, and advice given without it asked for too little.

    def latest_publish_start_seconds(self, sink_grace_seconds: float = 0.0) -> float:
        """How long after its claim was sent a batch may still start publishing.

        What the lease leaves once the publish (``--publish-timeout``, plus
        ``sink_grace_seconds``: the longest the sink runs past it) and the
        settle are set aside. A batch that waited longer goes back unpublished.
        See docs/how-it-works.md, "What a lease must hold".
        """
        return self.lease_seconds - self.publish_timeout_seconds - sink_grace_seconds - SETTLE_RESERVE_SECONDS

    def check_lease(self, sink_grace_seconds: float = 0.0, sink: str = "the") -> None:
        """Raise ``ConfigError`` unless the lease holds a claim, a publish and a settle.

        ``sink_grace_seconds`` is how long the ``sink`` may run past ``--publish-timeout``.
        """
        needed = CLAIM_RESERVE_SECONDS + self.publish_timeout_seconds + sink_grace_seconds + SETTLE_RESERVE_SECONDS
        if self.lease_seconds >= needed or math.isclose(self.lease_seconds, needed):
            return
        grace = f" + {sink_grace_seconds:g} s {sink} sink may take past it" if sink_grace_seconds else ""
        raise ConfigError(
            f"--lease-seconds {self.lease_seconds:g} is too short: use at least {_at_least(needed)} (a batch needs "
            f"{CLAIM_RESERVE_SECONDS:g} s to claim + --publish-timeout {self.publish_timeout_seconds:g} s{grace} "
            f"+ {SETTLE_RESERVE_SECONDS:g} s to settle)"
        )
