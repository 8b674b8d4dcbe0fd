"""The librdkafka settings of the relay's producer, and which a sink URL may change."""

from __future__ import annotations

import math
from typing import Any

from relay.config import KafkaSinkConfig
from relay.errors import ConfigError
from relay.kafka_options import checked_options

LINGER_MS = 5
BATCH_NUM_MESSAGES = 10_000
QUEUE_BUFFERING_MAX_MESSAGES = 100_000


def producer_config(config: KafkaSinkConfig, *, publish_timeout_seconds: float, client_id: str) -> dict[str, Any]:
    """The librdkafka settings for the relay's producer; ``config.options`` win where
    :mod:`relay.kafka_options` allows them (``ConfigError`` otherwise)."""
    timeout_ms = max(1, round(publish_timeout_seconds * 1000))
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        # Java's default partitioner: a key lands on the same partition as from a Java client.
        "partitioner": "murmur2_random",
        # librdkafka never gives a message up: one that expired in the middle of a key's
        # run would leave a gap the next ones fill. The relay's publish deadline purges
        # and replaces the producer instead (relay/sinks/kafka/client.py).
        "message.timeout.ms": 0,
        # Any other gap in a partition's sequence stops the producer (a fatal error the
        # sink answers by replacing it) rather than letting later messages through.
        "enable.gapless.guarantee": True,
        # Report a missing topic well before the message times out, so it is dead-lettered
        # as unknown rather than retried forever as "timed out".
        "topic.metadata.propagation.max.ms": min(30_000, max(1_000, timeout_ms // 2)),
        "linger.ms": LINGER_MS,
        "batch.num.messages": BATCH_NUM_MESSAGES,
        "queue.buffering.max.messages": QUEUE_BUFFERING_MAX_MESSAGES,
        "log.connection.close": False,
    }
    options = checked_options(config.options)
    # Either name sets it (librdkafka's alias); each one given is checked.
    for name in [n for n in ("linger.ms", "queue.buffering.max.ms") if n in options] or ["linger.ms"]:
        linger = options.get(name, str(LINGER_MS))
        shown = name if name == "linger.ms" else f"{name} (linger.ms)"
        try:
            linger_ms = float(linger)
        except ValueError:
            raise ConfigError(f"kafka option {shown}={linger[:20]!r} is not a number of milliseconds") from None
        if not math.isfinite(linger_ms) or linger_ms < 0:
            raise ConfigError(f"kafka option {shown}={linger[:20]!r} is not a number of milliseconds from 0 up")
        if linger_ms >= timeout_ms:
            raise ConfigError(
                f"kafka option {shown}={linger_ms:g} must be shorter than --publish-timeout ({timeout_ms} ms): "
                "messages would time out waiting in the producer's queue"
            )
    settings.update(options)
    return settings
