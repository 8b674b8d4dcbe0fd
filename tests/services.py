"""Make sure the servers the tests need are up; say how to start them if not.

``python -m tests.services --ensure`` starts PostgreSQL, RabbitMQ and MariaDB where they
are installed but stopped, and fails with the command to run otherwise.
Tansu (the Kafka-protocol broker) is started by the test session itself.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import socket
import subprocess
import sys
import time

PG_URL = os.environ.get("RELAY_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("RELAY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
#: A MySQL 8 or MariaDB server where tests may CREATE DATABASE (the path names no database).
MYSQL_URL = os.environ.get("RELAY_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306")


def listening(host: str, port: int) -> bool:
    """True when something accepts connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _wait(host: str, port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if listening(host, port):
            return True
        time.sleep(0.5)
    return False


def _start(command: list[str]) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(command, check=False, timeout=120, capture_output=True)


def ensure_postgres() -> str | None:
    """Start the local PostgreSQL cluster if needed; an error message if it stays down."""
    if listening("127.0.0.1", 5432):
        return None
    versions = sorted(glob.glob("/etc/postgresql/*"))
    if versions:
        _start(["pg_ctlcluster", "--skip-systemctl-redirect", os.path.basename(versions[-1]), "main", "start"])
    if _wait("127.0.0.1", 5432, 30):
        return None
    return (
        "PostgreSQL is not listening on 127.0.0.1:5432. Start it with "
        "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, "
        "or point RELAY_TEST_DATABASE_URL at a server (trust or password auth, CREATE DATABASE allowed)."
    )


def ensure_rabbitmq() -> str | None:
    """Start the local RabbitMQ if needed; an error message if it stays down."""
    if listening("127.0.0.1", 5672):
        return None
    _start(["rabbitmq-server", "-detached"])
    if _wait("127.0.0.1", 5672, 60):
        return None
    return "RabbitMQ is not listening on 127.0.0.1:5672. Start it with `rabbitmq-server -detached`."


def ensure_mysql() -> str | None:
    """Start the local MariaDB if needed; an error message if it stays down."""
    if listening("127.0.0.1", 3306):
        return None
    if os.path.exists("/usr/sbin/mariadbd"):
        _start(["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"])
    if _wait("127.0.0.1", 3306, 30):
        return None
    return (
        "MariaDB/MySQL is not listening on 127.0.0.1:3306. Start it with "
        "`start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd`, "
        "or point RELAY_TEST_MYSQL_URL at a server (mysql://user:pass@host:port, CREATE DATABASE allowed)."
    )


def main() -> int:
    """Check (and with --ensure, start) the servers; exit 1 with instructions if one is missing."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ensure", action="store_true", help="start what is installed but stopped")
    parser.parse_args()
    problems = [p for p in (ensure_postgres(), ensure_rabbitmq(), ensure_mysql()) if p]
    for problem in problems:
        print(f"tests.services: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
