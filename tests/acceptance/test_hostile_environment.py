"""The CLI started by a hostile shell: closed or broken standard streams, terminals that cannot
spell what an event holds, a C locale, and arguments holding bytes that are not UTF-8.

Each case runs ``outbox-relay`` as a subprocess, through ``bash`` where the shell's own
redirections (``2>&-``, ``| head -0``) are the point.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from devservers import free_port
from tests.acceptance.cli import CANARY, cli, env
from tests.acceptance.test_secrets_in_ps import _arguments
from tests.conftest import _url_for

#: Keys, topics and errors a terminal in ASCII cannot spell: Latin-1, the BMP beyond it, an emoji.
UNSPELLABLE = ["ké", "☃", "🦆", "日本"]
#: Bytes that are not UTF-8, as Python escapes them from a shell's argument or variable.
NOT_UTF8 = ["\udcff", "\udcc3", "\udced\udca0\udc80", "x\udce9y"]
#: What makes Python read arguments and its terminal as ASCII.
ASCII_LOCALES = [
    {"LC_ALL": "C", "PYTHONUTF8": "0"},
    {"PYTHONIOENCODING": "ascii"},
    {"PYTHONIOENCODING": "latin-1"},
]


@pytest.fixture(scope="module")
def dead_letters(pg_admin_url: str, migrated_template: str) -> Iterator[str]:
    """A database holding many dead letters whose topics, keys, payloads and errors are not ASCII."""
    name = f"outbox_relay_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(migrated_template))
        )
    url = _url_for(name)
    with psycopg.connect(url) as conn:
        for text in UNSPELLABLE:
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
                " SELECT %s, %s || g, jsonb_build_object('v', %s::text), 'failed', %s, now()"
                " FROM generate_series(1, 500) AS g",
                [f"t-{text}", text, text, f"error {text}"],
            )
    yield url
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def shell(script: str, *args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in bash with ``$relay`` the command and ``"$@"`` its arguments."""
    return subprocess.run(
        ["bash", "-c", f'relay="{sys.executable} -m relay"; {script}', "bash", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(**extra),
        check=False,
    )


def _cli(args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(**extra),
        check=False,
    )


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    said = done.stdout + done.stderr
    assert "Traceback" not in said and "Exception ignored" not in said, said


# -- closed and broken streams ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("closed", ["0<&-", "2>&-", "0<&- 2>&-"])
@pytest.mark.parametrize(("args", "expected"), [(["status", "--json"], 0), (["dead", "--json", "--limit", "3"], 0)])
def test_a_closed_stdin_or_stderr_does_not_stop_a_command(
    dead_letters: str, closed: str, args: list[str], expected: int
) -> None:
    # With descriptor 2 closed, the database connection took its number: the command died at once.
    done = shell(f'$relay "$@" {closed}', *args, "--database-url", dead_letters)
    assert done.returncode == expected, done.stderr
    no_traceback(done)
    assert json.loads(done.stdout)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("closed", ["2>&-", "0<&- >&- 2>&-"])
@pytest.mark.parametrize(
    "args",
    [
        ["status", "--database-url", "foo://x"],
        ["status", "--bogus"],
        ["dead", "--limit", "0", "--database-url", "postgresql://127.0.0.1:1/x"],
    ],
)
def test_bad_configuration_still_exits_2_with_stderr_closed(closed: str, args: list[str]) -> None:
    done = shell(f'$relay "$@" {closed}', *args)
    assert done.returncode == 2
    assert done.stdout == "", "the error went to stdout instead"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["status"], ["dead", "--limit", "3"], ["inspect", "1"], ["--help"]])
def test_a_closed_stdout_discards_the_output_and_the_command_succeeds(dead_letters: str, args: list[str]) -> None:
    done = shell('$relay "$@" >&-', *args, "--database-url", dead_letters)
    assert done.returncode == 0, done.stderr
    no_traceback(done)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("pipeline", "args"),
    [
        ('$relay "$@" | head -0', ["status"]),
        ('$relay "$@" | head -0', ["status", "--json"]),
        # 2,000 events fill more than a pipe's buffer: the command is still writing when head leaves.
        ('$relay "$@" | head -1', ["dead", "--limit", "2000"]),
        ('$relay "$@" | head -c 10', ["dead", "--limit", "2000", "--json"]),  # one line: head -1 would read it all
        ('$relay "$@" 2>&1 | head -0', ["status", "--database-url", "foo://x"]),
        ('$relay "$@" 2>&1 | head -0', ["status", "--bogus"]),
        ('RELAY_SINK_URL=x $relay "$@" 2>&1 | head -0', ["status"]),
    ],
)
def test_a_reader_gone_away_ends_the_command_with_141_and_nothing_more(
    dead_letters: str, pipeline: str, args: list[str]
) -> None:
    done = shell(f'{pipeline}; echo "exit=${{PIPESTATUS[0]}}" >&2', *args, "--database-url", dead_letters)
    no_traceback(done)
    exit_line = done.stderr.strip().splitlines()[-1]
    assert exit_line == "exit=141", done.stderr


# -- encodings and locales -----------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("locale", ASCII_LOCALES, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("args", [["dead", "--limit", "2000"], ["inspect", "1"], ["inspect", "1501"]])
def test_what_the_terminal_cannot_spell_is_escaped(dead_letters: str, locale: dict[str, str], args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "relay", *args, "--database-url", dead_letters],
        capture_output=True,
        timeout=60,
        env=env(**locale),
        check=False,
    )
    # Strict: every byte written is one the terminal's encoding can show.
    encoding = locale.get("PYTHONIOENCODING", "ascii")
    stdout, stderr = (out.decode(encoding) for out in (done.stdout, done.stderr))
    assert done.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    if args[0] == "dead":
        assert len(stdout.splitlines()) == 2000
        for text in UNSPELLABLE:
            shown = text.encode(encoding, "backslashreplace").decode(encoding)
            assert f"key={shown}1\t" in stdout, stdout[:500]
    else:
        assert "payload: " in stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", NOT_UTF8)
def test_bytes_that_are_not_utf8_in_an_argument_are_escaped_on_output(value: str) -> None:
    done = cli("status", "--table", value, "--database-url", "postgresql://127.0.0.1:1/x", PYTHONIOENCODING="utf-8")
    assert done.returncode == 2
    no_traceback(done)
    assert done.stderr.count("\n") == 1 and "invalid table name" in done.stderr


@pytest.fixture(params=["ünïcødé", "日本", "caf\u00e9 db"])
def database_named_in_utf8(request: pytest.FixtureRequest, pg_admin_url: str, migrated_template: str) -> Iterator[str]:
    """A migrated database whose name is not ASCII, with one dead letter keyed ``ké``."""
    name: str = request.param + uuid.uuid4().hex[:6]
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(migrated_template))
        )
    with psycopg.connect(_url_for(name)) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
            " VALUES ('t', 'ké', '{}', 'failed', 'x', now())"
        )
    yield _url_for(name)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("given", ["--database-url", "RELAY_DATABASE_URL", "DATABASE_URL"])
def test_utf8_arguments_and_variables_are_read_as_utf8_under_a_c_locale(
    database_named_in_utf8: str, given: str
) -> None:
    url = database_named_in_utf8
    how = {"LC_ALL": "C", "PYTHONUTF8": "0"}
    where: dict[str, str] = {given: url} if given.isupper() else {}
    flag = ["--database-url", url] if not where else []
    done = _cli(["requeue", "--key", "ké", "--json", *flag], {**how, **where})
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["requeued"]) == 1, done.stdout


#: Where a database URL holding bytes that are not UTF-8 may come from, each with every kind of such bytes.
BAD_URLS = [
    (bad, url, ["--database-url", "RELAY_DATABASE_URL"][n % 2])
    for n, (bad, url) in enumerate(
        itertools.product(
            NOT_UTF8,
            [
                "postgresql://app:{pw}@127.0.0.1:1/shop",
                "postgresql://app:{pw}@127.0.0.1:1/shop{bad}",
                "host=127.0.0.1 port=1 password={pw}",
            ],
        )
    )
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("bad", "url", "given"), BAD_URLS)
def test_a_database_url_that_is_not_utf8_is_refused_in_one_line_without_its_password(
    bad: str, url: str, given: str
) -> None:
    password = f"{CANARY}{bad}{CANARY[::-1]}"
    text = url.format(pw=password, bad=bad)
    args = ["status", "--database-url", text] if given.startswith("--") else ["status"]
    extra = {} if given.startswith("--") else {given: text}
    done = _cli(args, extra)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "not UTF-8" in done.stderr, done.stderr
    assert CANARY not in done.stderr and CANARY[::-1] not in done.stderr, done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("where", "password"),
    [
        ("--database-url", f"{CANARY}-pässwörd"),
        ("--database-url", f"{CANARY}-日本"),
        ("--sink", f"{CANARY}-pässwörd"),
        ("--sink", f"{CANARY}-日本"),
        # A database URL of such bytes is refused at once (above); a sink's waits for its broker.
        ("--sink", f"{CANARY}-\udcff"),
    ],
)
def test_a_password_not_in_ascii_is_masked_in_ps_under_a_c_locale(password: str, where: str) -> None:
    closed = free_port()
    database = f"postgresql://app{':' + password if where == '--database-url' else ''}@127.0.0.1:{closed}/shop"
    sink = f"amqp://app{':' + password if where == '--sink' else ''}@127.0.0.1:{closed}/"
    process = subprocess.Popen(
        [sys.executable, "-m", "relay", "run", "--database-url", database, "--sink", sink, "--startup-timeout", "30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env(LC_ALL="C", PYTHONUTF8="0"),
    )
    try:
        shown, ps = _arguments(process)  # type: ignore[arg-type]
    finally:
        process.kill()
        _, said = process.communicate()
    assert b"Traceback" not in said, said
    assert "***" in shown and CANARY not in shown and CANARY not in ps, shown
