"""The ``ssl-*`` options of a ``mysql://`` URL: what each means, and what is refused (relay/store/mysql/tls.py)."""

from __future__ import annotations

import ssl

import pytest

from relay.errors import ConfigError
from relay.store.mysql import Target
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
