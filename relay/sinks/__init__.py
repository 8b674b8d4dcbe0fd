"""Broker adapters behind the :class:`relay.sinks.base.Sink` port."""

from __future__ import annotations

from relay.config import AmqpSinkConfig, KafkaSinkConfig, SinkConfig
from relay.sinks.base import Sink


def build_sink(config: SinkConfig, *, publish_timeout_seconds: float) -> Sink:
    """The adapter for ``config``; broker libraries are imported only when used."""
    if isinstance(config, KafkaSinkConfig):
        from relay.sinks.kafka import KafkaSink

        return KafkaSink(config, publish_timeout_seconds=publish_timeout_seconds)
    if isinstance(config, AmqpSinkConfig):
        from relay.sinks.rabbitmq import RabbitMQSink

        return RabbitMQSink(config, publish_timeout_seconds=publish_timeout_seconds)
    raise TypeError(f"no sink for {config!r}")


__all__ = ["Sink", "build_sink"]
