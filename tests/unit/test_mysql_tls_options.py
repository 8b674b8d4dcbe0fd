"""The ``ssl-*`` options of a ``mysql://`` URL: what each means, and what is refused (relay/store/mysql/tls.py)."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from relay.config import TableName
from relay.errors import ConfigError
from relay.secrets import redact_url
from relay.store.mysql import Target
from relay.store.mysql.connection import Database
from relay.store.mysql.tls import SslMode, Tls

BASE = "mysql://app:s3cr3t@db.example:3306/shop"


@pytest.mark.parametrize(
    ("query", "mode", "ca"),
    [
        ("", SslMode.DISABLED, None),
        ("ssl-mode=DISABLED", SslMode.DISABLED, None),
        ("ssl-mode=disabled", SslMode.DISABLED, None),
        ("ssl-mode=REQUIRED", SslMode.REQUIRED, None),
        ("ssl_mode=Required", SslMode.REQUIRED, None),
        ("SSL-MODE=verify_ca", SslMode.VERIFY_CA, None),
        ("ssl-mode=VERIFY_CA&ssl-ca=/etc/ca.pem", SslMode.VERIFY_CA, "/etc/ca.pem"),
        ("ssl-ca=/etc/ca.pem", SslMode.VERIFY_CA, "/etc/ca.pem"),
        ("ssl_ca=%2Fetc%2Fca%20bundle.pem", SslMode.VERIFY_CA, "/etc/ca bundle.pem"),
        ("ssl-ca=/etc/ca.pem&ssl-mode=VERIFY_IDENTITY", SslMode.VERIFY_IDENTITY, "/etc/ca.pem"),
    ],
)
def test_the_mode_and_the_ca_come_from_the_url(query: str, mode: SslMode, ca: str | None) -> None:
    tls = Target.parse(f"{BASE}?{query}" if query else BASE).tls
    assert (tls.mode, tls.ca) == (mode, ca)


def test_a_client_certificate_and_its_key_are_read_too() -> None:
    tls = Target.parse(f"{BASE}?ssl-mode=VERIFY_IDENTITY&ssl-cert=/c.pem&ssl-key=/k.pem").tls
    assert (tls.cert, tls.key) == ("/c.pem", "/k.pem")


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("ssl-mode=PREFERRED", "falls back to plain text"),
        ("ssl-mode=preferred", "falls back to plain text"),
        ("ssl-mode=VERIFY", "is not one of"),
        ("ssl-mode=", "needs a value"),
        ("ssl=true", "unknown option"),
        ("sslmode=require", "unknown option"),
        ("charset=latin1", "unknown option"),
        ("ssl-mode=REQUIRED&ssl-mode=VERIFY_CA", "given twice"),
        ("ssl-mode=REQUIRED&ssl_mode=REQUIRED", "given twice"),
        ("ssl-mode=DISABLED&ssl-ca=/ca.pem", "ssl-mode is DISABLED"),
        ("ssl-mode=REQUIRED&ssl-ca=/ca.pem", "does not check ssl-ca"),
        ("ssl-mode=VERIFY_CA&ssl-key=/k.pem", "ssl-key goes with ssl-cert"),
    ],
)
def test_options_that_would_not_do_what_they_say_are_refused_without_the_password(query: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        Target.parse(f"{BASE}?{query}")
    assert says in str(info.value)
    assert "s3cr3t" not in str(info.value)


def test_each_mode_checks_what_its_name_says() -> None:
    assert Tls().context() is None
    required = Tls(SslMode.REQUIRED).context()
    assert required is not None
    assert (required.verify_mode, required.check_hostname) == (ssl.CERT_NONE, False)
    verify_ca = Tls(SslMode.VERIFY_CA).context()
    assert verify_ca is not None
    assert (verify_ca.verify_mode, verify_ca.check_hostname) == (ssl.CERT_REQUIRED, False)
    identity = Tls(SslMode.VERIFY_IDENTITY).context()
    assert identity is not None
    assert (identity.verify_mode, identity.check_hostname) == (ssl.CERT_REQUIRED, True)


@pytest.mark.parametrize(
    "tls",
    [
        Tls(SslMode.VERIFY_CA, ca="/nonexistent/ca.pem"),
        Tls(SslMode.REQUIRED, cert="/nonexistent/client.pem"),
        Tls(SslMode.VERIFY_IDENTITY, cert="/nonexistent/client.pem", key="/nonexistent/client.key"),
    ],
)
def test_a_file_that_cannot_be_read_is_a_clear_configuration_error(tls: Tls) -> None:
    with pytest.raises(ConfigError, match="cannot load ssl-ca, ssl-cert or ssl-key"):
        tls.context()


PASSPHRASE = "Pp-9qzx wörd"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A client certificate, and its key unencrypted and encrypted in the forms OpenSSL writes."""
    folder = tmp_path_factory.mktemp("mysql-client-keys")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=30)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "plain.key", "-out", "cert.pem", "-days", "1", "-subj", "/CN=relay test client")  # fmt: skip
    openssl("pkey", "-in", "plain.key", "-out", "pkcs8.key", "-aes256", "-passout", f"pass:{PASSPHRASE}")
    openssl("pkey", "-in", "plain.key", "-out", "traditional.key", "-traditional", "-des3",
            "-passout", f"pass:{PASSPHRASE}")  # fmt: skip
    # The certificate and its encrypted key in one file (ssl-cert alone).
    (folder / "both.pem").write_bytes((folder / "cert.pem").read_bytes() + (folder / "pkcs8.key").read_bytes())
    (folder / "pass").write_bytes(PASSPHRASE.encode() + b"\n")
    (folder / "pass-crlf").write_bytes(PASSPHRASE.encode() + b"\r\n")
    (folder / "pass-bare").write_bytes(PASSPHRASE.encode())
    (folder / "wrong").write_bytes(b"not-it\n")
    return {path.name: path for path in folder.iterdir()}


ENCRYPTED = [("cert.pem", "pkcs8.key"), ("cert.pem", "traditional.key"), ("both.pem", None)]


@pytest.mark.timeout(20)  # OpenSSL's own prompt would wait for a terminal's answer for ever
@pytest.mark.parametrize(("cert", "key"), ENCRYPTED)
def test_an_encrypted_key_without_its_passphrase_is_one_line_at_start_up_never_a_prompt(
    keys: dict[str, Path], cert: str, key: str | None
) -> None:
    tls = Tls(SslMode.REQUIRED, cert=str(keys[cert]), key=str(keys[key]) if key else None)
    with pytest.raises(
        ConfigError, match="ssl-key is encrypted: give its passphrase in a file with ssl-key-password-file"
    ):
        tls.context()
    # Through the URL, as the relay starts: the store's construction says so.
    query = f"ssl-mode=REQUIRED&ssl-cert={keys[cert]}" + (f"&ssl-key={keys[key]}" if key else "")
    with pytest.raises(ConfigError, match="is encrypted") as info:
        Database(f"{BASE}?{query}", TableName.parse("outbox"), connect_timeout=1, statement_timeout=None)
    assert "\n" not in str(info.value) and "s3cr3t" not in str(info.value)


@pytest.mark.parametrize("passphrase_file", ["pass", "pass-crlf", "pass-bare"])
@pytest.mark.parametrize(("cert", "key"), ENCRYPTED)
def test_the_passphrase_comes_from_a_file_and_the_context_is_built_once(
    keys: dict[str, Path], cert: str, key: str | None, passphrase_file: str
) -> None:
    query = f"ssl-mode=REQUIRED&ssl-cert={keys[cert]}&ssl-key-password-file={keys[passphrase_file]}"
    url = f"{BASE}?{query}" + (f"&ssl-key={keys[key]}" if key else "")
    tls = Target.parse(url).tls
    context = tls.context()
    assert isinstance(context, ssl.SSLContext) and tls.context() is context  # one for every connection
    assert str(keys[passphrase_file]) not in redact_url(url)  # a secret's file is masked as the secret


@pytest.mark.parametrize(
    ("passphrase_file", "says"),
    [("wrong", "does not decrypt ssl-key"), ("missing", "cannot read ssl-key-password-file")],
)
def test_a_passphrase_that_does_not_decrypt_or_cannot_be_read_is_one_line(
    keys: dict[str, Path], passphrase_file: str, says: str
) -> None:
    missing = keys["pass"].parent / "missing"
    tls = Tls(
        SslMode.REQUIRED,
        cert=str(keys["cert.pem"]),
        key=str(keys["pkcs8.key"]),
        key_password_file=str(keys.get(passphrase_file, missing)),
    )
    with pytest.raises(ConfigError, match=says) as info:
        tls.context()
    assert PASSPHRASE not in str(info.value) and "\n" not in str(info.value)


def test_an_unencrypted_key_never_reads_the_passphrase_file(keys: dict[str, Path]) -> None:
    missing = str(keys["pass"].parent / "missing")
    tls = Tls(SslMode.REQUIRED, cert=str(keys["cert.pem"]), key=str(keys["plain.key"]), key_password_file=missing)
    assert tls.context() is not None


def test_a_passphrase_file_without_a_client_certificate_is_refused() -> None:
    with pytest.raises(ConfigError, match="ssl-key-password-file goes with ssl-cert"):
        Target.parse(f"{BASE}?ssl-mode=REQUIRED&ssl-key-password-file=/run/secrets/p")
