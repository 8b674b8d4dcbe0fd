"""outbox-relay: delivers a PostgreSQL outbox table to Kafka or RabbitMQ, at least once."""

__version__ = "0.1.0"
