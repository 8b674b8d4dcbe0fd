"""Command-line flags of the example services that fall back to environment variables.

argparse converts a string default with the flag's ``type`` only when the
command that has the flag runs and the flag is not given. A variable's value
becomes that default, marked as coming from the environment, so a value the
type refuses ends the program with one line that names the variable, while
``--help`` and the other commands still work.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping
from typing import Any


class _FromEnvironment(str):
    """A flag's default as read from its environment variable, not converted yet."""

    __slots__ = ()


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    variable: str,
    environ: Mapping[str, str],
    help: str,
    secret: bool = False,
    **options: Any,
) -> None:
    """Add ``flag`` with ``options`` as ``add_argument`` takes them; ``variable``, when set, replaces the default.

    The help names the variable, and the default unless the flag is
    ``secret`` (a URL that may hold a password).
    """
    kind = options.pop("type", str)
    raw = environ.get(variable)
    if raw is not None:
        options["default"] = _FromEnvironment(raw)
    default = options.get("default")
    shown = "" if secret or default is None else f" (default: {default})"
    parser.add_argument(flag, type=_naming(variable, parser, kind), help=f"{help} [env {variable}]{shown}", **options)


def _naming(variable: str, parser: argparse.ArgumentParser, kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """``kind``, except that refusing the variable's value exits with a line that names it."""

    @functools.wraps(kind)
    def convert(text: str) -> Any:
        if not isinstance(text, _FromEnvironment):
            return kind(text)
        try:
            return kind(str(text))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            parser.exit(2, f"{parser.prog}: error: {variable}: {exc}\n")

    return convert
