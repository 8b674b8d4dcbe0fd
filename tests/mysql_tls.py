"""A MariaDB server that speaks TLS, for the tests of the ``ssl-*`` URL options.

The machine's MariaDB (127.0.0.1:3306) has TLS off, and its configuration
belongs to every project on the machine. This starts a private ``mariadbd`` on
a free loopback port, from a fresh data directory, with a certificate issued by
a CA made for the run: for ``127.0.0.1`` and ``db.example.test``, not for
``localhost``. Grant tables are skipped, so any user logs in without a password.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

INSTALL_DB = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
SERVER = shutil.which("mariadbd") or shutil.which("mysqld") or "/usr/sbin/mariadbd"
START_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class TlsServer:
    port: int
    #: The CA that issued the server's certificate, and one that did not.
    ca: Path
    other_ca: Path
    #: A client certificate and key issued by ``ca``.
    client_cert: Path
    client_key: Path

    def url(self, database: str, options: str = "", host: str = "127.0.0.1") -> str:
        return f"mysql://root@{host}:{self.port}/{database}" + (f"?{options}" if options else "")


def available() -> bool:
    return INSTALL_DB is not None and Path(SERVER).exists() and shutil.which("openssl") is not None


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(folder: Path) -> None:
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN=outbox-relay test {ca}", cwd=folder)  # fmt: skip
    for name, subject, names in (
        ("server", "/CN=db.example.test", "subjectAltName=IP:127.0.0.1,DNS:db.example.test"),
        ("client", "/CN=outbox-relay test client", "extendedKeyUsage=clientAuth"),
    ):
        (folder / f"{name}.ext").write_text(names + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=folder)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def tls_server() -> Iterator[TlsServer]:
    """Start the server; stop it and remove its files afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="relay-mariadb-tls-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        _certificates(folder)
        data = folder / "data"
        assert INSTALL_DB is not None
        subprocess.run(
            [INSTALL_DB, "--no-defaults", f"--datadir={data}", "--user=root", "--skip-test-db",
             "--auth-root-authentication-method=normal"],
            check=True, capture_output=True,
        )  # fmt: skip
        port = _free_port()
        process = subprocess.Popen(
            [SERVER, "--no-defaults", f"--datadir={data}", f"--port={port}", "--bind-address=127.0.0.1",
             f"--socket={folder / 'sock'}", f"--pid-file={folder / 'pid'}", "--user=root", "--skip-grant-tables",
             "--skip-log-bin", "--innodb-buffer-pool-size=32M", f"--log-error={folder / 'error.log'}",
             f"--ssl-ca={folder / 'ca.pem'}", f"--ssl-cert={folder / 'server.pem'}",
             f"--ssl-key={folder / 'server.key'}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mariadbd exited: {(folder / 'error.log').read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("mariadbd did not listen in time")
            time.sleep(0.1)
        yield TlsServer(port, folder / "ca.pem", folder / "other-ca.pem", folder / "client.pem", folder / "client.key")
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)
