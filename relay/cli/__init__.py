"""The ``outbox-relay`` command line: ``main`` runs one command.

- :mod:`.flags`: flags with an environment fallback (``RELAY_<FLAG>``);
- :mod:`.parser`: every command and flag;
- :mod:`.commands`: ``migrate`` and ``run``;
- :mod:`.admin`: the operator's commands, on the store's ``Admin`` port.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence

from relay import config
from relay.cli import admin, commands
from relay.cli.flags import PROG, add_env_flag, reject_bad_env
from relay.cli.parser import build_parser
from relay.config import parse_route, parse_sink_url
from relay.errors import ConfigError, RelayError
from relay.logs import configure_from_flags as configure_logging

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "migrate": commands.cmd_migrate,
    "run": commands.cmd_run,
    "status": admin.cmd_status,
    "dead": admin.cmd_dead,
    "requeue": admin.cmd_requeue,
    "skip": admin.cmd_skip,
    "inspect": admin.cmd_inspect,
    "purge": admin.cmd_purge,
    "replay": admin.cmd_replay,
}


def _secrets(args: argparse.Namespace) -> list[str]:
    from relay.store.postgres import password_of

    found = [password_of(args.database_url or "") or ""]
    sinks: list[config.SinkConfig] = []
    sink = getattr(args, "sink", None)
    if sink:
        with contextlib.suppress(ConfigError):
            sinks.append(parse_sink_url(sink))
    for route in getattr(args, "routes", None) or []:
        with contextlib.suppress(ConfigError):
            sinks.append(parse_route(route).sink)
    for parsed in sinks:
        if isinstance(parsed, config.KafkaSinkConfig):
            found += [v for k, v in parsed.options.items() if "password" in k]
        elif isinstance(parsed, config.AmqpSinkConfig):
            from urllib.parse import urlsplit

            found.append(urlsplit(parsed.url).password or "")
    return [s for s in found if s]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outbox-relay`` console script."""
    args = build_parser().parse_args(argv)
    reject_bad_env(args)
    secrets = _secrets(args)
    if not configure_logging(PROG, args.log_level, args.log_format, secrets):
        return 2
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"{PROG}: error: {_scrub(str(exc), secrets)}", file=sys.stderr)
        return 2
    except RelayError as exc:
        print(f"{PROG}: error: {_scrub(str(exc), secrets)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return " ".join(text.split())


__all__ = ["add_env_flag", "build_parser", "main", "reject_bad_env"]
