"""A canary password in every form, through every output of the CLI: one-line errors,
JSON logs (message and fields), /metrics, status and dead."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import psycopg
import pytest

import producers
from devservers import free_port
from tests.acceptance.cli import cli, env
from tests.integration.kafka_support import unique_topic
from tests.relay_support import status_json, wait_until
from tests.unit.test_secrets import PASSWORDS, leaks

DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"

#: A bad URL of each kind, and the command that reads it.
BAD = {
    "database URL, port out of range": ["status", "--database-url", "postgresql://app:{pw}@127.0.0.1:99999/db"],
    "database URL, unknown scheme": ["migrate", "--database-url", "pgsql://app:{pw}@127.0.0.1/db"],
    "database down": ["status", "--database-url", "postgresql://app:{pw}@127.0.0.1:{closed}/db"],
    "amqp URL, port out of range": ["run", "--database-url", DATABASE, "--sink", "amqp://u:{pw}@h:99999/"],
    "amqp URL, no host": ["run", "--database-url", DATABASE, "--sink", "amqp://u:{pw}@/"],
    "kafka URL, broker without port": ["run", "--database-url", DATABASE, "--sink", "kafka://u:{pw}@broker"],
    "route, unknown scheme": ["run", "--database-url", DATABASE, "--route", "a.*=amqpx://u:{pw}@h:1/"],
    "route, amqp port out of range": ["run", "--database-url", DATABASE, "--route", "a.*=amqp://u:{pw}@h:99999/"],
}


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return cli(*args, "--log-level", "DEBUG", "--log-format", "json")


@pytest.mark.timeout(480)
def test_a_bad_url_is_one_line_without_the_password_in_any_form() -> None:
    closed = str(free_port())
    jobs = {
        (case, form): [arg.format(pw=password, closed=closed) for arg in args]
        for case, args in BAD.items()
        for form, password in PASSWORDS.items()
    }
    with ThreadPoolExecutor(6) as pool:
        results = dict(zip(jobs, pool.map(run, jobs.values()), strict=True))
    for (case, form), result in results.items():
        errors = [line for line in result.stderr.splitlines() if line.startswith("outbox-relay: error: ")]
        assert result.returncode != 0 and len(errors) == 1, (case, form, result.stderr)
        assert "Traceback" not in result.stderr, (case, form, result.stderr)
    shown = {job: r.stdout + r.stderr for job, r in results.items() if leaks(r.stdout + r.stderr)}
    assert not shown, shown


def canary_database_url(database_url: str, password: str) -> str:
    """A URL to the test database carrying ``password`` (trust auth ignores it)."""
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    user, port, name = params["user"], params.get("port", 5432), params["dbname"]
    return f"postgresql://{user}:{quote(password, safe='')}@127.0.0.1:{port}/{name}"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


@pytest.mark.timeout(180)
def test_a_running_relay_and_the_admin_commands_show_no_password(database_url: str, kafka_bootstrap: str) -> None:
    raw = "Cnry1/Cnry2#Cnry3:Cnry4üCnry5"  # raw delimiters our Kafka URL parser accepts
    encoded = quote(PASSWORDS["every raw delimiter"], safe="")
    db = canary_database_url(database_url, PASSWORDS["every raw delimiter"] + "üß")
    db_keywords = f"{database_url} password='Cnry1 Cnry2' sslpassword=Cnry3"
    topic = unique_topic("secrets")
    kafka_route = (
        f"{topic}=kafka://relay:{raw}@{kafka_bootstrap}?sasl.oauthbearer.config={encoded}&ssl_key_pem={encoded}"
        f"&sasl.oauthbearer.client.secret={encoded}&ssl.keystore.password={encoded}&ssl.key.password={encoded}"
    )
    down_route = f"mq.*=amqp://u:{encoded}@127.0.0.1:{free_port()}/"
    with psycopg.connect(database_url) as conn:
        for n in range(5):
            producers.publish(conn, topic, {"n": n}, key="k")
        producers.publish(conn, "unrouted", {"n": 0})
    port = free_port()
    args = ["run", "--database-url", db, "--route", kafka_route, "--route", down_route]
    args += ["--metrics-port", str(port), "--log-level", "DEBUG", "--log-format", "json"]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-m", "relay", *args], stdout=out, stderr=out, text=True, env=env())
        try:
            wait_until(lambda: status_json(database_url)["pending"] == 0 and status_json(database_url)["failed"] == 1,
                       timeout=60)  # fmt: skip
            wait_until(
                lambda: 'outbox_relay_sink_up{sink="amqp' in scrape(port) and "} 0.0" in scrape(port), timeout=30
            )
            metrics = scrape(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
        out.seek(0)
        logs = out.read()
    assert code == 0, logs
    assert "route_down" in logs and '"sink": "amqp://u:***@127.0.0.1' in logs, "the down route was logged"
    commands = [run(["status", "--json", "--database-url", db]), run(["dead", "--database-url", db_keywords])]
    commands += [run(["dead", "--json", "--database-url", db]), run(["status", "--database-url", db_keywords])]
    assert all(c.returncode == 0 for c in commands), [c.stderr for c in commands]
    assert "no route for topic" in commands[1].stdout
    outputs = {"logs": logs, "metrics": metrics, **{" ".join(c.args[3:5]): c.stdout + c.stderr for c in commands}}
    shown = {name: [line for line in text.splitlines() if leaks(line)] for name, text in outputs.items()}
    assert not any(shown.values()), shown


#: Command lines argparse itself refuses, echoing an argument that carries a password.
MISTYPED = {
    "a flag the command does not take": ["status", "--database-url", DATABASE, "--sink", "amqp://u:{pw}@127.0.0.1/"],
    "a misspelt flag": ["migrate", "--databse-url=postgresql://app:{pw}@127.0.0.1/db"],
    "a URL where the command goes": ["--database-url", "postgresql://app:{pw}@127.0.0.1/db", "status"],
    "a route the command does not take": ["dead", "--route", "a.*=kafka://127.0.0.1:1?sasl.password={pw}"],
    "a bad choice beside a URL": ["run", "--database-url", "mysql://app:{pw}@127.0.0.1/db", "--log-format", "xml"],
    "an unquoted space in the password": ["status", "--database-url", "postgresql://app:{pw} Cnry9@127.0.0.1/db"],
}


@pytest.mark.timeout(300)
def test_a_mistyped_command_line_echoes_no_password() -> None:
    jobs = {
        (case, form): [arg.format(pw=password) for arg in args]
        for case, args in MISTYPED.items()
        for form, password in PASSWORDS.items()
    }
    # The space case splits its URL into two arguments, as a shell does.
    jobs = {
        job: [part for arg in args for part in (arg.split(" ") if job[0].startswith("an unquoted") else [arg])]
        for job, args in jobs.items()
    }
    with ThreadPoolExecutor(6) as pool:
        results = dict(zip(jobs, pool.map(lambda args: cli(*args), jobs.values()), strict=True))
    for job, result in results.items():
        assert result.returncode == 2 and "error:" in result.stderr, (job, result.stderr)
    shown = {job: r.stdout + r.stderr for job, r in results.items() if leaks(r.stdout + r.stderr)}
    assert not shown, shown
