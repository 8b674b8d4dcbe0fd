"""The ``outbox-relay`` command line: ``main`` runs one command.

- :mod:`.flags`: flags with an environment fallback (``RELAY_<FLAG>``);
- :mod:`.parser`: every command and flag;
- :mod:`.commands`: ``migrate`` and ``run``;
- :mod:`.admin`: the operator's commands, on the store's ``Admin`` port;
- :mod:`.streams`: closed or broken standard streams, encodings and locales.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import shlex
import sys
from collections.abc import Callable, Sequence

from relay import secrets
from relay.cli import admin, commands, streams
from relay.cli.flags import PROG, add_env_flag, misspelt_env, reject_bad_env
from relay.cli.parser import build_parser
from relay.errors import ConfigError, RelayError
from relay.logs import configure_from_flags as configure_logging

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "migrate": commands.cmd_migrate,
    "run": commands.cmd_run,
    "status": admin.cmd_status,
    "dead": admin.cmd_dead,
    "requeue": admin.cmd_requeue,
    "retry": admin.cmd_retry,
    "skip": admin.cmd_skip,
    "inspect": admin.cmd_inspect,
    "purge": admin.cmd_purge,
    "replay": admin.cmd_replay,
}


def _secrets(args: argparse.Namespace) -> list[str]:
    texts = [args.database_url, getattr(args, "sink", None), *(getattr(args, "routes", None) or [])]
    return [secret for text in texts if text for secret in secrets.secrets_in(text)]


def _secrets_in_argv(given: Sequence[str]) -> list[str]:
    # A URL cut by an unquoted space arrives as two arguments: each pair is read as one too.
    texts = [*given, *(f"{a} {b}" for a, b in itertools.pairwise(given))]
    return [secret for text in texts for secret in secrets.secrets_in(text)]


def _hide_from_ps(found: list[str]) -> None:
    """Rewrite this process's command line (``ps``, ``/proc/PID/cmdline``) with ``found`` masked.

    Every account on the host can read a process's arguments; a password given
    in ``--database-url`` or ``--sink`` stays there for the life of a relay.
    The title is set as soon as the arguments are parsed (the environment, which
    only the same user can read, is the better place: ``RELAY_DATABASE_URL``)."""
    if not found:
        return
    try:
        import setproctitle
    except ImportError:  # an install without it: the arguments stay as given
        return
    setproctitle.setproctitle(streams.printable_title(secrets.Scrubber(found)(shlex.join(sys.orig_argv))))


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line parsed; argparse's own errors (an unknown flag, a typo in a
    flag's name, a bad choice) echo the arguments, so they are scrubbed of the
    secrets in them first."""
    raw = list(sys.argv[1:] if argv is None else argv)
    given = [streams.as_utf8(arg) for arg in raw]
    # The spellings as Python first decoded them are what the process title shows.
    found = _secrets_in_argv(given) + (_secrets_in_argv(raw) if raw != given else [])
    if argv is None:
        _hide_from_ps(found)
    scrub = secrets.Scrubber(found)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return build_parser().parse_args(given)
    finally:
        sys.stderr.write(scrub(said.getvalue()))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outbox-relay`` console script."""
    if argv is None:
        streams.prepare()
    try:
        code = _main(argv)
        streams.flush()
    except BrokenPipeError:
        # The reader went away (`outbox-relay dead | head`): as any Unix tool, stop quietly. The
        # output still buffered would fail again at exit, so stdout and stderr point at nothing.
        streams.discard_output()
        return streams.BROKEN_PIPE_EXIT
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = _parse(argv)
    reject_bad_env(args)
    for warning in misspelt_env():
        print(warning, file=sys.stderr)
    found = _secrets(args)
    if not configure_logging(PROG, args.log_level, args.log_format, found):
        return 2
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"{PROG}: error: {_scrub(str(exc), found)}", file=sys.stderr)
        return 2
    except RelayError as exc:
        print(f"{PROG}: error: {_scrub(str(exc), found)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _scrub(text: str, found: list[str]) -> str:
    return secrets.one_line(text, secrets.Scrubber(found))


__all__ = ["add_env_flag", "build_parser", "main", "reject_bad_env"]
