"""The Kafka sink (confluent-kafka, librdkafka), one concern per module.

- :mod:`.sink`: :class:`KafkaSink`, the adapter behind the sink port;
- :mod:`.client`: one producer and the thread serving its callbacks;
- :mod:`.batch`: the delivery state of one ``publish`` call;
- :mod:`.errors`: which librdkafka errors are permanent, unreachable or the producer's own;
- :mod:`.settings`: the producer's settings, and which a sink URL may change.
"""

from __future__ import annotations

from relay.sinks.kafka.errors import MAX_ERROR_CHARS, classify, describe, is_unreachable
from relay.sinks.kafka.settings import LINGER_MS, producer_config
from relay.sinks.kafka.sink import CHECK_TIMEOUT_SECONDS, WAIT_MARGIN_SECONDS, KafkaSink

__all__ = [
    "CHECK_TIMEOUT_SECONDS",
    "LINGER_MS",
    "MAX_ERROR_CHARS",
    "WAIT_MARGIN_SECONDS",
    "KafkaSink",
    "classify",
    "describe",
    "is_unreachable",
    "producer_config",
]
