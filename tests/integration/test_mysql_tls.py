"""TLS to MySQL/MariaDB from the URL's ``ssl-*`` options, against a real server that speaks it.

The server (tests/mysql_tls.py) holds a certificate for 127.0.0.1 and
db.example.test, issued by a CA made for the run. Both drivers are covered:
PyMySQL (``migrate``) and asyncmy (the relay's and the admin commands'
connections). Each mode that checks something is shown refusing what it
should; none of them ever falls back to plain text.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from relay.config import TableName
from relay.errors import StoreError
from relay.store.mysql import MySQLAdmin
from relay.store.mysql.connection import Database
from relay.store.mysql.migrate import migrate
from tests import mysql_tls
from tests.mysql_support import connect
from tests.mysql_tls import TlsServer

TABLE = TableName.parse("outbox")
PASSWORD = "s3cr3t-tls"

pytestmark = pytest.mark.skipif(not mysql_tls.available(), reason="needs mariadb-install-db, mariadbd and openssl")


@pytest.fixture(scope="module")
def server() -> Iterator[TlsServer]:
    with mysql_tls.tls_server() as started:
        conn = connect(started.url("mysql"))
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE DATABASE shop")
        finally:
            conn.close()
        yield started


def url(server: TlsServer, options: str, host: str = "127.0.0.1") -> str:
    # The server skips grant tables: any password logs in, and none may show in an error.
    return server.url("shop", options, host).replace("root@", f"root:{PASSWORD}@")


async def cipher(target: str) -> str:
    """The TLS cipher of an asyncmy connection the relay opens to ``target`` ('' for plain TCP)."""
    db = Database(target, TABLE, connect_timeout=5, statement_timeout=None)

    async def work(cur: Any) -> str:
        await cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        return str((await cur.fetchone())[1])

    try:
        return await db.call("stats", work)
    finally:
        await db.close()


def pymysql_cipher(target: str) -> str:
    from relay.store.mysql.migrate import connect as migrate_connect

    with migrate_connect(target, TABLE) as conn, conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        return str(cur.fetchone()[1])


@pytest.mark.parametrize(
    "options",
    [
        "ssl-mode=REQUIRED",
        "ssl-mode=required",
        "ssl_mode=REQUIRED",
        "ssl-mode=VERIFY_CA&ssl-ca={ca}",
        "ssl-ca={ca}",  # VERIFY_CA, as for the MySQL client
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}",
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&ssl-cert={cert}&ssl-key={key}",
    ],
)
def test_each_mode_that_the_server_satisfies_connects_encrypted_with_both_drivers(
    server: TlsServer, options: str
) -> None:
    target = url(server, options.format(ca=server.ca, cert=server.client_cert, key=server.client_key))
    assert asyncio.run(cipher(target)).startswith("TLS_")
    assert pymysql_cipher(target).startswith("TLS_")


def test_without_options_the_connection_is_plain_as_before(server: TlsServer) -> None:
    """With both drivers: PyMySQL, told nothing of TLS, would try it when the server offers it (its PREFERRED
    mode, which ssl-mode refuses to name: it falls back to plain text without saying so)."""
    for options in ("", "ssl-mode=DISABLED", "ssl_mode=disabled"):
        assert asyncio.run(cipher(url(server, options))) == ""
        assert pymysql_cipher(url(server, options)) == ""


@pytest.mark.parametrize(
    ("options", "host", "why"),
    [
        # Signed by another CA.
        ("ssl-mode=VERIFY_CA&ssl-ca={other}", "127.0.0.1", "certificate verify failed"),
        ("ssl-mode=VERIFY_IDENTITY&ssl-ca={other}", "127.0.0.1", "certificate verify failed"),
        # Signed by the right CA, but not for this name.
        ("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}", "localhost", "match"),
        # The system's CAs did not sign a CA made for this run.
        ("ssl-mode=VERIFY_CA", "127.0.0.1", "certificate verify failed"),
    ],
)
def test_a_certificate_the_mode_does_not_accept_fails_the_connection_without_the_password(
    server: TlsServer, options: str, host: str, why: str
) -> None:
    target = url(server, options.format(ca=server.ca, other=server.other_ca), host)
    with pytest.raises(StoreError) as relay_side:
        asyncio.run(cipher(target))
    with pytest.raises(StoreError) as migrate_side:
        migrate(target, TABLE)
    for info in (relay_side, migrate_side):
        assert why in str(info.value).lower(), info.value
        assert PASSWORD not in str(info.value)


def test_a_name_checked_by_verify_ca_only_is_accepted(server: TlsServer) -> None:
    # localhost is not on the certificate: VERIFY_CA does not look, VERIFY_IDENTITY does (above).
    assert asyncio.run(cipher(url(server, f"ssl-mode=VERIFY_CA&ssl-ca={server.ca}", "localhost"))).startswith("TLS_")


@pytest.mark.parametrize("options", ["ssl-mode=REQUIRED", "ssl-mode=VERIFY_IDENTITY", "ssl-mode=VERIFY_CA"])
def test_a_server_without_tls_is_refused_never_used_in_plain_text(mysql_url: str, options: str) -> None:
    # The machine's MariaDB has TLS off.
    target = f"{mysql_url}?{options}"
    with pytest.raises(StoreError, match="does not speak TLS"):
        asyncio.run(cipher(target))
    with pytest.raises(StoreError, match="SSL is required but the server doesn't support it"):
        migrate(target, TABLE)


def test_migrate_status_and_the_admin_work_over_tls_from_the_command_line(server: TlsServer) -> None:
    target = url(server, f"ssl-mode=VERIFY_IDENTITY&ssl-ca={server.ca}")
    for command in (["migrate"], ["migrate"], ["status", "--json"]):  # migrate twice: idempotent
        done = subprocess.run(
            [sys.executable, "-m", "relay", *command, "--database-url", target],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout + done.stderr
    assert json.loads(done.stdout)["pending"] == 0

    async def status() -> int:
        admin = MySQLAdmin(target, TABLE)
        await admin.open()
        try:
            return (await admin.status()).pending
        finally:
            await admin.close()

    assert asyncio.run(status()) == 0


@pytest.mark.parametrize("password", ["p@ss/w%rd", "pässwörd-ключ", "a:b@c%40d"])
def test_odd_passwords_and_a_ca_path_with_spaces_and_percent_signs_work_and_never_show(
    server: TlsServer, tmp_path: Path, password: str
) -> None:
    folder = tmp_path / "ca dir %"
    folder.mkdir()
    ca = folder / "the ca%.pem"
    shutil.copy(server.ca, ca)
    target = (
        f"mysql://root:{quote(password, safe='')}@127.0.0.1:{server.port}/shop"
        f"?ssl-mode=VERIFY_IDENTITY&ssl-ca={quote(str(ca), safe='/')}"
    )
    assert asyncio.run(cipher(target)).startswith("TLS_")
    assert pymysql_cipher(target).startswith("TLS_")
    # And refused for another CA, without the password in the error.
    wrong = target.replace(quote(str(ca), safe="/"), quote(str(server.other_ca), safe="/"))
    with pytest.raises(StoreError) as info:
        asyncio.run(cipher(wrong))
    assert password not in str(info.value) and quote(password, safe="") not in str(info.value)


def test_an_encrypted_client_key_with_its_passphrase_file_connects_with_both_drivers(
    server: TlsServer, tmp_path: Path
) -> None:
    key, passphrase = tmp_path / "client-encrypted.key", tmp_path / "passphrase"
    subprocess.run(
        ["openssl", "pkey", "-in", str(server.client_key), "-out", str(key), "-aes256", "-passout", "pass:Pp-9qzx"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    passphrase.write_text("Pp-9qzx\n")
    options = f"ssl-mode=VERIFY_IDENTITY&ssl-ca={server.ca}&ssl-cert={server.client_cert}&ssl-key={key}"
    target = url(server, f"{options}&ssl-key-password-file={passphrase}")
    assert asyncio.run(cipher(target)).startswith("TLS_")
    assert pymysql_cipher(target).startswith("TLS_")
