"""The RabbitMQ sink (pika, publisher confirms), one concern per module.

- :mod:`.sink`: :class:`RabbitMQSink`, the adapter behind the sink port;
- :mod:`.batch`: one ``publish`` call: whose turn it is (one unconfirmed message per key), what became of each event;
- :mod:`.handoff`: handing a batch's events to the channel (holds admitted, refusals caught first);
- :mod:`.link`: one connection and its confirm-mode channel, as a state machine;
- :mod:`.transport`: pika's transport, corked so a chunk of messages is one write;
- :mod:`.frames`: the Basic.Publish frames, packed directly;
- :mod:`.limits`: what the broker would refuse, checked before sending;
- :mod:`.params`: connection parameters from the URL, and pika's errors in words.
"""

from __future__ import annotations

from relay.sinks.rabbitmq.frames import publish_frames
from relay.sinks.rabbitmq.link import CLOSE_TIMEOUT_SECONDS
from relay.sinks.rabbitmq.sink import MAX_MESSAGE_BYTES, RabbitMQSink
from relay.sinks.rabbitmq.transport import CORK_MAX_BYTES

__all__ = ["CLOSE_TIMEOUT_SECONDS", "CORK_MAX_BYTES", "MAX_MESSAGE_BYTES", "RabbitMQSink", "publish_frames"]
