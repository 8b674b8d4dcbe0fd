"""Bad configuration: one line naming the problem, non-zero exit, no traceback, no password."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import psycopg
import pytest

from devservers import free_port
from relay.cli import build_parser
from tests.acceptance.cli import CANARY, cli, spawn


def assert_one_line_error(result: object, needle: str) -> None:
    import subprocess

    assert isinstance(result, subprocess.CompletedProcess)
    assert result.returncode != 0, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("outbox-relay: error:")]
    assert len(errors) == 1, result.stderr
    assert needle in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert CANARY not in result.stderr + result.stdout


def test_help_documents_every_command_and_flag() -> None:
    result = cli("--help")
    assert result.returncode == 0
    for command in ("migrate", "run", "status", "dead", "requeue", "skip"):
        assert command in result.stdout
        sub = cli(command, "--help")
        assert sub.returncode == 0, sub.stderr
        assert "--database-url" in sub.stdout and "RELAY_DATABASE_URL" in sub.stdout
    run_help = cli("run", "--help").stdout
    for flag in ("--sink", "--batch-size", "--max-attempts", "--backoff-initial", "--backoff-max", "--metrics-port"):
        assert flag in run_help


def test_every_flag_has_an_environment_fallback() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        for action in command._actions:
            long = [o for o in action.option_strings if o.startswith("--")]
            # Selectors name what one invocation acts on; an environment default would be a trap.
            if not long or long[0] in ("--help", "--id", "--topic", "--key", "--all", "--since", "--until"):
                continue
            assert "[env RELAY_" in (action.help or ""), (name, long[0])


def test_no_database_url() -> None:
    assert_one_line_error(cli("status"), "no database configured")


def test_unknown_database_scheme_hides_the_password() -> None:
    assert_one_line_error(cli("status", "--database-url", f"mssql://u:{CANARY}@h/db"), "unknown database URL scheme")


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql:app:{CANARY}@127.0.0.1:5432/db",
        f"postgresql:/app:{CANARY}@127.0.0.1:5432/db",
        f"postgresql//app:{CANARY}@127.0.0.1:5432/db",
        f"//app:{CANARY}@127.0.0.1:5432/db",
        f"app:{CANARY}@127.0.0.1:5432/db?sslmode=disable",
        CANARY,  # the password alone, set where the URL belongs
    ],
)
def test_a_database_url_missing_its_scheme_slashes_hides_the_password(url: str) -> None:
    # libpq takes such a text for a keyword string and echoes it whole ('missing "=" after ...').
    assert_one_line_error(cli("status", "--database-url", url), "invalid database URL")


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app@127.0.0.1:5432/db?password{CANARY}",
        f"postgresql://app@127.0.0.1:5432/db?sslmode=disable&sslpassword{CANARY}",
        f"host=127.0.0.1 dbname=db user=app password{CANARY}",
        f"mysql://app@127.0.0.1:3306/db?ssl_key_password{CANARY}",
    ],
)
def test_a_secret_option_missing_its_equals_sign_hides_the_value(url: str) -> None:
    # The parser names the option it cannot read, and the value is glued to its name.
    assert_one_line_error(cli("status", "--database-url", url), "")


@pytest.mark.parametrize("option", ["sasl.password", "sasl_password", "ssl.key.password", "sasl.oauthbearer.config"])
def test_a_kafka_secret_option_missing_its_equals_sign_hides_the_value(database_url: str, option: str) -> None:
    sink = f"kafka://127.0.0.1:1?acks=all&{option}{CANARY}"
    assert_one_line_error(cli("run", "--database-url", database_url, "--sink", sink), "unknown kafka option")
    assert_one_line_error(cli("run", "--database-url", database_url, "--route", f"a.*={sink}"), "unknown kafka option")


@pytest.mark.parametrize("value", [f"'it's-{CANARY}'", f"'a'{CANARY}", f"'{CANARY}'x'"])
def test_a_keyword_password_cut_by_a_raw_quote_hides_every_piece(value: str) -> None:
    # libpq ends a quoted value at its first unescaped quote and echoes the rest as a keyword it cannot read.
    url = f"host=127.0.0.1 port={free_port()} dbname=db user=app password={value}"
    assert_one_line_error(cli("status", "--database-url", url), "invalid database URL")


@pytest.mark.parametrize(
    ("flag", "url", "needle"),
    [
        ("--database-url", f"postgresql://app@127.0.0.1:1/db?password=x =-{CANARY}", ""),
        ("--sink", f"kafka://127.0.0.1:1?sasl.password=x;a&;{CANARY}&acks=all", ""),
        # After a raw space, "CANARY=..." reads as an option of its own: nothing past the space is shown.
        ("--sink", f"kafka://127.0.0.1:1?sasl.password=x {CANARY}=&acks=all", "holds a space"),
        ("--sink", f"kafka://127.0.0.1:1?acks=all&sasl.password=x\t{CANARY}=y", "holds a space"),
        ("--sink", f"amqp://guest@127.0.0.1:1/?password=x {CANARY}=z", "holds a space"),
        ("--database-url", f"postgresql://app@127.0.0.1:1/db?password=x {CANARY}%:TSBU='x", "holds a space"),
        ("--database-url", f"mysql://app@127.0.0.1:1/db?password=x {CANARY}=1", "holds a space"),
    ],
)
def test_a_secret_piece_after_a_raw_space_or_ampersand_is_hidden(
    database_url: str, flag: str, url: str, needle: str
) -> None:
    args = ["--database-url", database_url, "--sink", url] if flag == "--sink" else ["--database-url", url]
    assert_one_line_error(cli("status" if flag == "--database-url" else "run", *args), needle)


@pytest.mark.parametrize("sink", [CANARY, f"app:{CANARY}@h:9092", f"h:9092?sasl.password={CANARY}", f"{CANARY}/x"])
def test_a_sink_without_a_scheme_is_refused_without_being_shown(database_url: str, sink: str) -> None:
    assert_one_line_error(cli("run", "--database-url", database_url, "--sink", sink), "has no scheme://")
    assert_one_line_error(cli("run", "--database-url", database_url, RELAY_SINK=sink), "has no scheme://")


def test_unreachable_database_at_start_up() -> None:
    url = f"postgresql://app:{CANARY}@127.0.0.1:{free_port()}/db"
    for command in (["status"], ["migrate"], ["run", "--sink", "kafka://127.0.0.1:9"]):
        assert_one_line_error(cli(*command, "--database-url", url), "failed")


def test_env_fallbacks_are_read(database_url: str) -> None:
    result = cli("status", "--json", DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    result = cli("status", "--json", RELAY_DATABASE_URL=database_url, DATABASE_URL="postgresql://nobody@h:1/x")
    assert result.returncode == 0, result.stderr
    result = cli("status", "--json", RELAY_DATABASE_URL="", DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    assert_one_line_error(cli("status", RELAY_DATABASE_URL=database_url, RELAY_TABLE="nope"), "does not exist")


@pytest.mark.parametrize("table", ['outbox"; drop table t;--', "a.b.c", "x y"])
def test_invalid_table_name_is_refused_before_any_sql(database_url: str, table: str) -> None:
    assert_one_line_error(cli("migrate", "--database-url", database_url, "--table", table), "invalid table name")
    with psycopg.connect(database_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename = 't' OR tablename LIKE 'x%'"
        ).fetchone() == (0,)


@pytest.mark.parametrize(
    ("sink", "needle"),
    [
        ("", "no sink configured"),
        (f"redis://u:{CANARY}@h:1", "unknown sink scheme"),
        ("kafka://nohostport", "is not host:port"),
        (f"amqp://u:{CANARY}@h:notaport/", "invalid sink URL"),
        ("kafka://h:1?format=avro", "format='avro': use one of native, cloudevents, cloudevents-structured"),
        (f"amqp://u:{CANARY}@h:5672/?format=ce", "format='ce': use one of native, cloudevents"),
        ("kafka://h:1?format=cloudevents&format=native", "sink option 'format' is given twice"),
        (f"amqp://u:{CANARY}@h:5672/?exchange=a&exchange=b", "sink option 'exchange' is given twice"),
    ],
)
def test_bad_sink_url(database_url: str, sink: str, needle: str) -> None:
    assert_one_line_error(cli("run", "--database-url", database_url, "--sink", sink), needle)


@pytest.mark.parametrize(
    ("route", "needle"),
    [
        ("billing.*", "invalid route 'billing.*': use PATTERN=URL"),
        (f"amqp://u:{CANARY}@h:5672/?exchange=x", "use PATTERN=URL"),
        ("=kafka://h:1", "topic pattern before '=' is empty"),
        ("billing.*=", "has no sink URL"),
        (f"billing.*=redis://u:{CANARY}@h:1", "unknown sink scheme"),
        (f"billing.*=amqp://u:{CANARY}@h:notaport/", "invalid sink URL"),
    ],
)
def test_bad_route(database_url: str, route: str, needle: str) -> None:
    assert_one_line_error(cli("run", "--database-url", database_url, "--route", route), needle)
    assert_one_line_error(cli("run", "--database-url", database_url, RELAY_ROUTES=f"*.x=kafka://h:1 {route}"), needle)


@pytest.mark.parametrize(
    ("where", "what"),
    [
        ("/%2F?exchange=" + "x" * 256, "exchange"),
        ("/%2F?exchange=" + "\u00e9" * 128, "exchange"),
        ("/" + "v" * 256, "vhost"),
        ("/" + "%C3%A9" * 128 + "?exchange=amq.direct", "vhost"),
    ],
)
def test_an_amqp_name_too_long_for_amqp_is_a_config_error_not_an_outage(
    database_url: str, amqp_url: str, where: str, what: str
) -> None:
    # The real broker, reachable with these credentials: before, pika failed encoding the name and
    # the sink said "cannot reach RabbitMQ" (exit 1), and a route with it stayed down for good.
    base = amqp_url.split("/%2F")[0]
    needle = f"the {what} name in amqp sink URL"
    result = cli("run", "--database-url", database_url, "--sink", base + where)
    assert_one_line_error(result, needle)
    assert result.returncode == 2
    routed = cli("run", "--database-url", database_url, "--route", f"billing.*={base}{where}", "--sink", amqp_url)
    assert_one_line_error(routed, needle)
    assert routed.returncode == 2


def test_an_event_source_with_credentials_is_refused(database_url: str) -> None:
    source = f"https://app:{CANARY}@shop.example/orders"
    sink = "kafka://h:1?format=cloudevents"
    result = cli("run", "--database-url", database_url, "--sink", sink, "--event-source", source)
    assert_one_line_error(result, "holds a user or password")
    assert_one_line_error(
        cli("run", "--database-url", database_url, "--sink", sink, RELAY_EVENT_SOURCE=source), "holds"
    )


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("/boutique/caf\u00e9", "not ASCII"),
        ("/orders/100%", "percent-encoding of two hex digits"),
        ("/orders#a#b", "a second '#'"),
        ("/orders[1]", "may only enclose an IP address"),
        ("1st:orders", "after no scheme"),
        (f"//app:{CANARY}@shop.example/orders", "holds a user or password"),
    ],
)
def test_an_event_source_that_is_no_uri_reference_is_refused(database_url: str, source: str, needle: str) -> None:
    sink = "kafka://h:1?format=cloudevents"
    assert_one_line_error(cli("run", "--database-url", database_url, "--sink", sink, "--event-source", source), needle)


@pytest.mark.parametrize("sink", ["kafka://h:1", "amqp://h:1/?format=native"])
def test_an_event_source_no_sink_would_use_is_refused(database_url: str, sink: str) -> None:
    needle = "no sink has format=cloudevents"
    assert_one_line_error(cli("run", "--database-url", database_url, "--sink", sink, "--event-source", "/s"), needle)
    assert_one_line_error(cli("run", "--database-url", database_url, "--sink", sink, RELAY_EVENT_SOURCE="/s"), needle)


def test_a_route_after_the_catch_all_is_refused(database_url: str) -> None:
    result = cli("run", "--database-url", database_url, "--route", "*=kafka://h:1", "--sink", "kafka://h:2")
    assert_one_line_error(result, "--sink comes after the catch-all route '*'")


def test_bad_numbers_in_flags_and_env(database_url: str) -> None:
    result = cli("run", "--database-url", database_url, "--sink", "kafka://h:1", "--batch-size", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr and "--batch-size" in result.stderr
    result = cli("run", "--database-url", database_url, "--sink", "kafka://h:1", RELAY_MAX_ATTEMPTS="many")
    assert result.returncode == 2 and "RELAY_MAX_ATTEMPTS" in result.stderr and "Traceback" not in result.stderr
    # A bad variable fails only the command that reads it: help and other commands still work.
    for args, shown in ((("--help",), "status"), (("status", "--help"), "--json"), (("run", "--help"), "--batch-size")):
        result = cli(*args, RELAY_BATCH_SIZE="abc", RELAY_METRICS_PORT="abc")
        assert result.returncode == 0 and shown in result.stdout, result.stderr
    result = cli("status", "--json", "--database-url", database_url, RELAY_BATCH_SIZE="abc", RELAY_METRICS_PORT="abc")
    assert result.returncode == 0 and json.loads(result.stdout)["pending"] == 0, result.stderr


@pytest.mark.parametrize(
    ("flags", "env", "named"),
    [
        (["--backoff-max", "1e20"], {}, "--backoff-max"),
        (["--poll-interval", "inf"], {}, "--poll-interval"),
        (["--lease-seconds", "nan"], {}, "--lease-seconds"),
        ([], {"RELAY_STARTUP_TIMEOUT": "nan"}, "RELAY_STARTUP_TIMEOUT"),
        ([], {"RELAY_KEEP_SENT": "ture"}, "RELAY_KEEP_SENT"),
        ([], {"RELAY_LISTEN": "abc"}, "RELAY_LISTEN"),
    ],
)
def test_a_duration_past_all_sense_or_a_switch_neither_on_nor_off_is_refused(
    database_url: str, flags: list[str], env: dict[str, str], named: str
) -> None:
    result = cli("run", "--database-url", database_url, "--sink", "kafka://h:1", *flags, timeout=60.0, **env)
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_unreachable_brokers_at_start_up(database_url: str) -> None:
    port = free_port()
    for sink in (f"kafka://127.0.0.1:{port}", f"amqp://guest:{CANARY}@127.0.0.1:{port}/%2F"):
        result = cli("run", "--database-url", database_url, "--sink", sink, timeout=90)
        assert_one_line_error(result, str(port))


def test_a_stop_while_waiting_for_servers_at_start_up_exits_0_at_once() -> None:
    port = free_port()
    relay = spawn(
        "run", "--database-url", f"postgresql://app:{CANARY}@127.0.0.1:{port}/shop", "--sink", f"kafka://127.0.0.1:{port}",
        "--startup-timeout", "120",
    )  # fmt: skip
    try:
        assert relay.stderr is not None
        # Signal once it has failed a try and is waiting: its signal handlers are in place.
        while "not started yet, trying again" not in relay.stderr.readline():
            assert relay.poll() is None, relay.communicate()
        relay.send_signal(signal.SIGTERM)
        _, stderr = relay.communicate(timeout=10)
    finally:
        relay.kill()
    assert relay.returncode == 0, stderr
    assert "Traceback" not in stderr and CANARY not in stderr


def test_a_read_only_database_is_refused_at_start_up_but_admin_reads_work(
    database_url: str, pg_admin_url: str, amqp_url: str
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
    result = cli("run", "--database-url", database_url, "--sink", amqp_url)
    assert_one_line_error(result, "the database is read-only")
    assert result.returncode == 1
    status = cli("status", "--json", "--database-url", database_url)
    assert status.returncode == 0 and json.loads(status.stdout)["pending"] == 0, status.stderr


def test_routes_whose_brokers_are_all_unreachable_at_start_up(database_url: str) -> None:
    port = free_port()
    routes = f"billing.*=kafka://127.0.0.1:{port} *=amqp://guest:{CANARY}@127.0.0.1:{port}/%2F"
    result = cli("run", "--database-url", database_url, timeout=90, RELAY_ROUTES=routes)
    assert_one_line_error(result, "every sink is down")
    assert str(port) in result.stderr


def test_a_taken_metrics_port_or_unknown_metrics_host(database_url: str, amqp_url: str) -> None:
    sink = amqp_url  # reachable: the port must fail on its own, before or after connecting
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("run", "--database-url", database_url, "--sink", sink, "--metrics-port", str(port))
        assert_one_line_error(result, f"cannot serve metrics on 127.0.0.1:{port}")
        assert result.returncode == 2
    unknown_host = ("--metrics-port", "0", "--metrics-host", "no-such-host.invalid")
    result = cli("run", "--database-url", database_url, "--sink", sink, *unknown_host)
    assert_one_line_error(result, "cannot serve metrics on no-such-host.invalid")
    assert result.returncode == 2


def test_migrate_twice_and_status_json(empty_database: str) -> None:
    first = cli("migrate", "--database-url", empty_database)
    assert first.returncode == 0 and "applied 1" in first.stdout, first.stderr
    second = cli("migrate", "--database-url", empty_database)
    assert second.returncode == 0 and "up to date" in second.stdout
    with psycopg.connect(empty_database) as conn:
        conn.execute("INSERT INTO outbox (topic, payload, created_at) VALUES ('t', '{}', now() - interval '5 seconds')")
    status = json.loads(cli("status", "--json", "--database-url", empty_database).stdout)
    assert status["pending"] == 1 and status["in_flight"] == 0 and status["failed"] == 0
    assert status["oldest_pending_age_seconds"] >= 5
    text = cli("status", "--database-url", empty_database).stdout
    assert "pending: 1" in text


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--batch-size", "abc"],
        ["run", "--poll-interval", "soon"],
        ["run", "--metrics-port", "70000"],
        ["dead", "--limit", "-1"],
        ["status", "--no-such-flag"],
        ["no-such-command"],
        [],
    ],
)
def test_a_command_line_argparse_refuses_is_one_line_too(args: list[str]) -> None:
    result = cli(*args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("outbox-relay") and ": error: " in lines[0] and "--help" in lines[0], lines
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        (["--publish-timeout", "1e-9"], {}, "--publish-timeout must be at least 0.1"),
        ([], {"RELAY_PUBLISH_TIMEOUT": "0.05"}, "--publish-timeout must be at least 0.1"),
        (["--poll-interval-max", "0"], {}, "--poll-interval-max must be positive"),
        (["--sink", "kafka://127.0.0.1:\u0669\u0660\u0669\u0662"], {}, "is not host:port"),
        (["--sink", "kafka://127.0.0.1:\uff19\uff10\uff19\uff12"], {}, "is not host:port"),
        (["--sink", "kafka://127.0.0.1:9092?linger.ms=nan"], {}, "not a number of milliseconds from 0 up"),
        (["--sink", "kafka://127.0.0.1:9092?linger.ms=-1"], {}, "not a number of milliseconds from 0 up"),
        (["--sink", "kafka://127.0.0.1:9092?queue.buffering.max.ms=inf"], {}, "not a number of milliseconds"),
        (["--sink", "kafka://127.0.0.1:9092?linger.ms=1&queue.buffering.max.ms=nan"], {}, "milliseconds"),
        (["--sink", "kafka://127.0.0.1:9092?batch.size=1_000"], {}, "batch.size='1_000' is not a whole number"),
        (["--sink", "kafka://127.0.0.1:9092?batch.num.messages=4294967297"], {}, "is not a whole number"),
        (["--sink", "kafka://127.0.0.1:9092?statistics.interval.ms=abc"], {}, "is not a whole number"),
        (["--sink", "kafka://127.0.0.1:9092?linger.ms=1_000"], {}, "linger.ms='1_000' is not a number in ASCII"),
    ],
)
def test_values_no_publish_could_work_with_are_refused_at_start(
    database_url: str, flags: list[str], env: dict[str, str], needle: str
) -> None:
    args = ["run", "--database-url", database_url, *flags]
    if "--sink" not in flags:
        args += ["--sink", "kafka://127.0.0.1:9092"]
    result = cli(*args, timeout=60, **env)
    assert_one_line_error(result, needle)
    assert result.returncode == 2


def test_skip_refuses_a_publish_timeout_run_refuses(database_url: str) -> None:
    result = cli("skip", "--id", "1", "--database-url", database_url, RELAY_PUBLISH_TIMEOUT="0")
    assert_one_line_error(result, "--publish-timeout must be at least 0.1")


def test_an_empty_metrics_host_is_the_default_loopback_not_every_interface(database_url: str, amqp_url: str) -> None:
    port = free_port()
    relay = spawn("run", "--database-url", database_url, "--sink", amqp_url, "--metrics-port", str(port),
                  RELAY_METRICS_HOST=" ")  # fmt: skip
    try:
        deadline = 30.0
        started = time.monotonic()
        while time.monotonic() - started < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("metrics never served on 127.0.0.1")
        listening = [line for line in Path("/proc/net/tcp").read_text().splitlines()[1:] if f":{port:04X} " in line]
        assert listening and all(line.split()[1].startswith("0100007F:") for line in listening), listening
        on_ipv6 = [line for line in Path("/proc/net/tcp6").read_text().splitlines()[1:] if f":{port:04X} " in line]
        assert on_ipv6 == [], on_ipv6
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("?bogus=1", 'invalid URI query parameter: "bogus"'),
        ("?sslmode=bogus", 'invalid sslmode value: "bogus"'),
        ("?target_session_attrs=nonsense", 'invalid target_session_attrs value: "nonsense"'),
        ("?gssencmode=maybe", 'invalid gssencmode value: "maybe"'),
        ("?port=abc", 'invalid integer value "abc" for connection option "port"'),
        ("?port=\u0661\u0660", 'invalid integer value "\u0661\u0660" for connection option "port"'),
        ("?port=99999", 'invalid port number: "99999"'),
        ("?port=-1", 'invalid port number: "-1"'),
        ("?port=5432,5433", "could not match 2 port numbers to 1 hosts"),
    ],
)
def test_a_database_url_libpq_refuses_is_a_configuration_error_at_once(
    database_url: str, query: str, needle: str
) -> None:
    """Not "trying again" for --startup-timeout: no wait mends it (MySQL's URL checks say so at once too)."""
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    url = f"postgresql://{params['user']}:{CANARY}@127.0.0.1:{params.get('port', 5432)}/{params['dbname']}{query}"
    for args in (["status"], ["run", "--sink", "kafka://127.0.0.1:1", "--startup-timeout", "30"]):
        started = time.monotonic()
        result = cli(*args, "--database-url", url, timeout=60)
        assert_one_line_error(result, needle)
        assert result.returncode == 2 and time.monotonic() - started < 15, result.stderr
    keywords = f"{psycopg.conninfo.make_conninfo(database_url)} password={CANARY} bogus=1"
    assert_one_line_error(cli("status", "--database-url", keywords), 'invalid connection option "bogus"')


@pytest.mark.parametrize(
    ("name", "meant"),
    [("RELAY_ROUTE", "RELAY_ROUTES"), ("RELAY_FIELD_HEADER", "RELAY_FIELD_HEADERS"),
     ("RELAY_BATCHSIZE", "RELAY_BATCH_SIZE"), ("RELAY_MAX_ATTEMPT", "RELAY_MAX_ATTEMPTS"),
     # A unit or a word more or less, as the settings' constants and other tools name them; another case.
     ("RELAY_PUBLISH_TIMEOUT_SECONDS", "RELAY_PUBLISH_TIMEOUT"), ("RELAY_POLL_INTERVAL_MAX_SECONDS",
     "RELAY_POLL_INTERVAL_MAX"), ("RELAY_LEASE", "RELAY_LEASE_SECONDS"), ("RELAY_SINK_URL", "RELAY_SINK"),
     ("RELAY_DATABASE", "RELAY_DATABASE_URL"), ("relay_batch_size", "RELAY_BATCH_SIZE"),
     ("Relay_Max_Attempts", "RELAY_MAX_ATTEMPTS")],
)  # fmt: skip
def test_a_misspelt_variable_is_named_not_silently_ignored(database_url: str, name: str, meant: str) -> None:
    variables: dict[str, str] = {name: "x", "RELAY_SOMETHING_ELSE": "1"}
    result = cli("status", "--json", "--database-url", database_url, timeout=60, **variables)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("outbox-relay: warning:")]
    assert warnings == [f"outbox-relay: warning: {name} is not read (did you mean {meant}?); it has no effect"]
