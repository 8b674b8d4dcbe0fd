"""The ``outbox-relay`` command's entry point (also ``python -m relay``).

A publishing service may install the package without its dependencies
(``pip install --no-deps outbox-relay`` beside ``psycopg``): ``producers`` and
``consumers`` need nothing more, the relay needs its broker clients. Started
there, the command says so in one line instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

#: The relay's dependencies, by the module imported and the distribution that provides it.
RELAY_DEPENDENCIES = {
    "psycopg": "psycopg",
    "confluent_kafka": "confluent-kafka",
    "pika": "pika",
    "tenacity": "tenacity",
    "prometheus_client": "prometheus-client",
}


def main() -> int:
    """Run the command line, or say which of the relay's dependencies are missing (exit 2).

    The commands import what they use when they run (``--help`` and the operator's
    commands need only psycopg), so a missing module is caught around the whole run."""
    try:
        from relay.cli import main as run_cli

        return run_cli()
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in RELAY_DEPENDENCIES:
            raise
        missing = [dist for module, dist in RELAY_DEPENDENCIES.items() if importlib.util.find_spec(module) is None]
        print(
            f"outbox-relay: the relay needs {', '.join(missing)}, not installed here (an install for publishing"
            " only, with --no-deps?): pip install outbox-relay",
            file=sys.stderr,
        )
        return 2
