"""The command's standard streams, arguments and environment, made safe before anything runs.

A shell or a supervisor can start ``outbox-relay`` with a standard stream closed
(``2>&-``), with stdout a pipe whose reader goes away (``| head -1``), in a
terminal whose encoding cannot spell what an event holds (``LC_ALL=C``,
``PYTHONIOENCODING=ascii``), or with UTF-8 arguments under a locale Python
reads as ASCII. None of these may end in a traceback, a hang or a mangled
password; docs/cli.md says what each one does.
"""

from __future__ import annotations

import io
import os
import sys

#: The exit code of a command whose reader went away, as a shell reports a process killed by SIGPIPE.
BROKEN_PIPE_EXIT = 141

_STD_FDS = (0, 1, 2)


def prepare() -> None:
    """Make the standard streams safe to use; call it first thing in a command's process.

    A closed descriptor 0, 1 or 2 is opened on ``/dev/null``: left closed, the
    next file or socket the command opens would take its number, and whatever
    a library writes to "stderr" (libpq prints notices there) would go into
    the database connection. What the stream's encoding cannot spell is
    written as a backslash escape (``\\xe9``, ``\\udcff``) instead of raising
    ``UnicodeEncodeError``.
    """
    for fd in _STD_FDS:
        try:
            os.fstat(fd)
        except OSError:
            _onto_devnull(fd)
    # Python sets a stream that was closed at start-up to None: print() then drops
    # what goes to it, but anything that calls its write() fails.
    if sys.stdout is None:
        sys.stdout = _text_stream(1)
    if sys.stderr is None:
        sys.stderr = _text_stream(2)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def discard_output() -> None:
    """Point stdout and stderr at ``/dev/null``, once their reader has gone away.

    What is still buffered would otherwise fail again when the interpreter
    flushes it at exit ("Exception ignored ... BrokenPipeError")."""
    for fd in (1, 2):
        _onto_devnull(fd)


def flush() -> None:
    """Flush stdout and stderr now, so that a reader gone away is noticed while it can still be handled."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def as_utf8(text: str) -> str:
    """``text`` (an argument or an environment variable) read as UTF-8, whatever the locale says.

    Under a C or POSIX locale with Python's UTF-8 mode off (``PYTHONUTF8=0``),
    or another locale that is not UTF-8, Python decodes ``ä`` given in UTF-8 as
    two escaped bytes; a password holding it would then never match. Bytes that
    are not UTF-8 stay escaped as they are (``\\udcff``), for the check of each
    value to refuse them by name.
    """
    if sys.getfilesystemencoding().lower().replace("-", "") == "utf8":
        return text
    raw = os.fsencode(text)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return text


def printable_title(text: str) -> str:
    """``text`` with bytes that are not UTF-8 shown as U+FFFD: a process title must encode as UTF-8."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _onto_devnull(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        open(fd, "wb", closefd=False),  # lives as long as the process
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


__all__: list[str] = ["BROKEN_PIPE_EXIT", "as_utf8", "discard_output", "flush", "prepare", "printable_title"]
