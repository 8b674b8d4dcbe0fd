"""Write ``docs/reference/cli.md`` from ``relay.cli.build_parser()``.

Run ``python docs/gen_cli_reference.py`` after changing a command or a flag;
``--check`` only says whether the page is stale. ``tests/unit/test_docs.py``
fails while the committed page differs from what this script renders.

The output depends on nothing but the parser: the ``RELAY_*`` and
``DATABASE_URL`` variables, which ``build_parser`` reads as defaults, are
hidden while it runs, and no terminal width is involved.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "reference" / "cli.md"
COMMAND = "python docs/gen_cli_reference.py"

# env_flag and env_switch in relay/cli/flags.py append these to every help text.
_ENV_RE = re.compile(r"\s*\[env ([A-Z][A-Z0-9_]*)\]")
_DEFAULT_RE = re.compile(r"\s*\(default: [^()]*\)$")
# Flags, environment variables and URLs in help texts are set as code.
_CODE_RE = re.compile(r"(?<![\w`])(--[a-z][a-z0-9-]*|[A-Z][A-Z0-9]*_[A-Z0-9_]+|[a-z]+\+?[a-z]*://\S+)")


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    """Hide the variables ``build_parser`` turns into defaults."""
    hidden = {name: value for name, value in os.environ.items() if name.startswith("RELAY_") or name == "DATABASE_URL"}
    for name in hidden:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(hidden)


def _parser() -> argparse.ArgumentParser:
    if str(ROOT) not in sys.path:
        # Run as a script from a clone that was not installed with pip.
        sys.path.insert(0, str(ROOT))
    from relay.cli import build_parser

    with _clean_environment():
        return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise LookupError(f"{parser.prog} has no subcommands")


def _cell(text: str) -> str:
    """Help text as a table cell: code spans for flags, variables and URLs."""
    text = " ".join(text.split()).replace("|", "\\|")
    return _CODE_RE.sub(r"`\1`", text)


def _split_help(action: argparse.Action) -> tuple[str, str | None]:
    """The help text without the env and default notes, and the env variable."""
    text = action.help or ""
    env = _ENV_RE.search(text)
    text = _ENV_RE.sub("", text)
    text = _DEFAULT_RE.sub("", text)
    return text, env.group(1) if env else None


def _metavar(action: argparse.Action) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    return action.dest.upper()


def _flag_cell(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{_metavar(action)}`"
    if isinstance(action, argparse.BooleanOptionalAction):
        return " / ".join(f"`{option}`" for option in action.option_strings)
    option = max(action.option_strings, key=len)
    if action.nargs == 0:
        return f"`{option}`"
    return f"`{option} {_metavar(action)}`"


def _default_cell(action: argparse.Action) -> str:
    if action.required or (not action.option_strings and action.nargs is None):
        return "required"
    if isinstance(action, argparse.BooleanOptionalAction):
        if action.default is None:
            return ""
        return f"`{action.option_strings[0 if action.default else 1]}`"
    if action.nargs == 0:
        return "off" if not action.default else "on"
    if action.default is None:
        return ""
    return f"`{action.default}`"


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Positional arguments first, then flags, each in the order they were added."""
    shown = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]
    return [a for a in shown if not a.option_strings] + [a for a in shown if a.option_strings]


def _groups_note(parser: argparse.ArgumentParser) -> list[str]:
    notes = []
    for group in parser._mutually_exclusive_groups:
        flags = ", ".join(f"`{max(a.option_strings, key=len)}`" for a in group._group_actions)
        notes.append(f"{'Exactly' if group.required else 'At most'} one of {flags}.")
    return notes


def _command_section(prog: str, name: str, parser: argparse.ArgumentParser) -> list[str]:
    positionals = "".join(f" {_metavar(a)}" for a in parser._actions if not a.option_strings)
    lines = [f"## {name}", "", "```text", f"{prog} {name} [OPTIONS]{positionals}", "```", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    lines += ["| argument | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for action in _arguments(parser):
        text, env = _split_help(action)
        env_cell = f"`{env}`" if env else ""
        lines.append(f"| {_flag_cell(action)} | {env_cell} | {_default_cell(action)} | {_cell(text)} |")
    lines.append("")
    notes = _groups_note(parser)
    if notes:
        lines += [*notes, ""]
    return lines


def render() -> str:
    """The whole reference page, as Markdown."""
    parser = _parser()
    prog = parser.prog
    commands = _subcommands(parser)
    summaries = {choice.dest: choice.help or "" for choice in commands._choices_actions}
    lines = [
        "# CLI reference",
        "",
        "<!-- Generated from relay.cli.build_parser() by docs/gen_cli_reference.py. Do not edit; run",
        f"     `{COMMAND}` instead. -->",
        "",
        _cell(parser.description or ""),
        "",
        "```text",
        f"{prog} [--version] COMMAND [OPTIONS]",
        f"{prog} COMMAND --help",
        "```",
        "",
        "A flag given on the command line wins over its environment variable, and the",
        "environment variable over the default. A switch's variable reads `1`, `true`,",
        "`yes` or `on` (any case) as on, `0`, `false`, `no` or `off` as off, and empty",
        "as unset; any other value is refused.",
        "",
        "Arguments and variables are read as UTF-8, also under a C or POSIX locale;",
        "a database URL holding bytes that are not UTF-8 is refused (exit 2) without",
        "being echoed. What the terminal's encoding cannot show (`PYTHONIOENCODING=ascii`,",
        "`LC_ALL=C` with `PYTHONUTF8=0`) is written as a backslash escape (`k\\xe9`). A",
        "closed stdin, stdout or stderr (`2>&-`) reads or writes nothing and changes",
        "nothing else: the command runs and exits as it would. A reader that goes",
        "away (`outbox-relay dead | head -1`) ends the command quietly with exit",
        "code 141, as a shell reports SIGPIPE.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    lines += [f"| [`{name}`](#{name}) | {_cell(summaries.get(name, ''))} |" for name in commands.choices]
    lines.append("")
    for name, subparser in commands.choices.items():
        lines += _command_section(prog, name, subparser)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the page, or with ``--check`` report whether it is stale."""
    cli = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0] if __doc__ else None)
    cli.add_argument("--check", action="store_true", help="exit 1 if the page differs, write nothing")
    args = cli.parse_args(argv)
    text = render()
    current = OUTPUT.read_text("utf-8") if OUTPUT.exists() else None
    if args.check:
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text, "utf-8")
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
