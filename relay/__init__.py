"""outbox-relay: delivers a PostgreSQL outbox table to Kafka or RabbitMQ, at least once."""

from importlib.metadata import PackageNotFoundError, version

try:
    # Written once, in pyproject.toml; the installed distribution carries it.
    __version__ = version("outbox-relay")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
