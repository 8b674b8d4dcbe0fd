"""The librdkafka settings of the relay's producer, and which a sink URL may change."""

from __future__ import annotations

from typing import Any

from relay.config import KafkaSinkConfig
from relay.errors import ConfigError

LINGER_MS = 5
BATCH_NUM_MESSAGES = 10_000
QUEUE_BUFFERING_MAX_MESSAGES = 100_000

# Settings a sink URL may not weaken: the contract promises acks=all plus idempotence.
_GUARANTEES = {
    "acks": {"all", "-1"},
    "request.required.acks": {"all", "-1"},
    "enable.idempotence": {"true", "1"},
}


def producer_config(config: KafkaSinkConfig, *, publish_timeout_seconds: float, client_id: str) -> dict[str, Any]:
    """The librdkafka settings for the relay's producer; ``config.options`` win."""
    timeout_ms = max(1, round(publish_timeout_seconds * 1000))
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        # Java's default partitioner: a key lands on the same partition as from a Java client.
        "partitioner": "murmur2_random",
        "message.timeout.ms": timeout_ms,
        # Report a missing topic well before the message times out, so it is dead-lettered
        # as unknown rather than retried forever as "timed out".
        "topic.metadata.propagation.max.ms": min(30_000, max(1_000, timeout_ms // 2)),
        "linger.ms": LINGER_MS,
        "batch.num.messages": BATCH_NUM_MESSAGES,
        "queue.buffering.max.messages": QUEUE_BUFFERING_MAX_MESSAGES,
        "log.connection.close": False,
    }
    for name, allowed in _GUARANTEES.items():
        value = config.options.get(name)
        if value is not None and value.strip().lower() not in allowed:
            raise ConfigError(f"kafka option {name}={value!r} would break delivery guarantees; remove it")
    settings.update(config.options)
    return settings
