"""Passwords written raw in configuration, cut by parsers into pieces too short to scrub one by one.

tests/unit/test_secrets.py uses canaries whose every piece is long and marked;
here every piece is short (two or three letters), as real passwords' often are,
so a leak shows as a short run: each canary's letters pairs are rare in English
and in the relay's own messages.
"""

from __future__ import annotations

import re
import time
from urllib.parse import quote

import psycopg
import psycopg.conninfo
import pytest

from relay.config import KafkaSinkConfig, check_database_url, parse_route, parse_sink_url, split_routes
from relay.errors import ConfigError
from relay.secrets import Scrubber, ambiguity, secrets_in
from relay.sinks.rabbitmq.params import connection_parameters

#: Passwords holding raw delimiters, with short pieces between them.
RAW = {
    "slash and hash": "p@qz/w:xj#1",
    "short pieces": "Qx1@Zk2:Vj3/Wq4",
    "question mark": "qz?xj",
    "hash only": "qzx#jvq",
    "space": "qzxj vqkw",
    "slash only": "qzx/jvq",
}
URLS = {
    "postgresql": "postgresql://app:{pw}@127.0.0.1:5499/shop",
    "mysql": "mysql://app:{pw}@127.0.0.1:3306/shop",
    "amqp": "amqp://relay:{pw}@127.0.0.1:5672/%2F",
    "kafka": "kafka://relay:{pw}@127.0.0.1:9092",
}


def pieces(password: str) -> list[str]:
    """The runs of two or more letters and digits of ``password``: what a leak would show."""
    return [piece for piece in re.split(r"[^A-Za-z0-9]+", password) if len(piece) >= 2]


def shows_any(text: str, password: str) -> list[str]:
    return [piece for piece in pieces(password) if piece in text]


def refuse(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        if text.startswith(("postgresql", "mysql")):
            check_database_url(text)
        else:
            parse_sink_url(text)
    return caught.value


@pytest.mark.parametrize("password", RAW.values(), ids=RAW.keys())
@pytest.mark.parametrize("template", URLS.values(), ids=URLS.keys())
def test_a_url_whose_raw_password_cuts_it_is_refused_without_a_piece_of_it(template: str, password: str) -> None:
    url = template.format(pw=password)
    if ambiguity(url) is None:
        # The relay reads a kafka:// URL's hosts up to its '?' itself: its password comes out whole.
        config = parse_sink_url(url)
        assert isinstance(config, KafkaSinkConfig) and config.options["sasl.password"] == password
        return
    error = refuse(url)
    assert not shows_any(str(error), password), error
    assert "percent-encode" in str(error)


@pytest.mark.parametrize("password", RAW.values(), ids=RAW.keys())
def test_a_route_with_such_a_url_is_refused_without_a_piece_of_it(password: str) -> None:
    routes = split_routes(f"billing.*=amqp://u:{password}@127.0.0.1:5672/%2F  audit.*=kafka://127.0.0.1:9092")
    assert len(routes) == 2, routes
    with pytest.raises(ConfigError) as caught:
        parse_route(routes[0])
    assert not shows_any(str(caught.value), password), caught.value
    assert parse_route(routes[1]).pattern == "audit.*"


@pytest.mark.parametrize(
    "url",
    [
        "kafka://127.0.0.1:9092?sasl.username=me@corp.example&sasl.password=x&security.protocol=SASL_PLAINTEXT",
        "kafka://u:p@ss@127.0.0.1:9092",  # a raw '@' in the password: the last '@' ends it
        "amqp://u:p%2Fq%23r%3Fs%20t@127.0.0.1:5672/%2F",
        "postgresql://u:p%2Fq%23r@127.0.0.1:5432/db?application_name=a@b",
        "postgresql://127.0.0.1/db",
        "mysql://root@127.0.0.1:3306/db",
    ],
)
def test_urls_that_can_be_read_whole_are_not_refused(url: str) -> None:
    assert ambiguity(url) is None
    if url.startswith(("postgresql", "mysql")):
        check_database_url(url)
    else:
        parse_sink_url(url)


def test_an_upper_case_database_scheme_is_handed_on_in_lower_case() -> None:
    assert check_database_url("POSTGRESQL://u@127.0.0.1/db") == "postgresql://u@127.0.0.1/db"


@pytest.mark.parametrize(
    ("secret", "said"),
    [
        ("p@qz/w:xj#1", "failed to resolve host 'qz/w:xj'"),
        ("Qx1@Zk2:Vj3/Wq4", "invalid port 'Zk2:Vj3' in 'Zk2:Vj3/Wq4'"),
        ("qzx/jvq#wkz", "no such database: jvq#wkz"),
    ],
)
def test_a_run_of_short_pieces_is_scrubbed_whole(secret: str, said: str) -> None:
    scrubbed = Scrubber([secret])(said)
    assert not shows_any(scrubbed, secret.split("@", 1)[-1] if secret.startswith("p@") else secret), scrubbed


@pytest.mark.parametrize(
    ("text", "secret_parts"),
    [
        ("host=127.0.0.1 user=u password=qzxj vqkw wkzq dbname=x", ["vqkw", "wkzq"]),
        ("kafka://127.0.0.1:9092?sasl.password=Qzx1&Vjq2Tail&acks=all", ["Vjq2Tail"]),
        ("billing.*=kafka://u:x@h:9092?sasl.password=qzxj vqkw", ["vqkw"]),
        # A piece that starts with '=', ';' or '#' is no option's name: it is the secret's rest too.
        ("postgresql://app@127.0.0.1/shop?password=qzxj =vqkw&sslmode=disable", ["=vqkw"]),
        ("host=127.0.0.1 password=qzxj =vqkw dbname=x", ["=vqkw"]),
        ("kafka://127.0.0.1:9092?sasl.password=Qzx1;a&;Vjq2Tail&acks=all", [";Vjq2Tail"]),
        ("kafka://127.0.0.1:9092?sasl.password=Qzx1&#Vjq2Tail&acks=all", ["#Vjq2Tail"]),
        ("host=127.0.0.1 password=qzxj !vqkw;%wk dbname=x", ["!vqkw;%wk"]),
        ("kafka://127.0.0.1:9092?sasl.password=Qzx1&%Vjq2;#Tail&acks=all", ["%Vjq2;#Tail"]),
    ],
)
def test_a_secret_value_cut_by_a_raw_ampersand_or_space_is_found_whole(text: str, secret_parts: list[str]) -> None:
    found = secrets_in(text)
    for part in secret_parts:
        assert any(part in secret for secret in found), (part, found)
    # What follows as a real option is not taken for the secret's rest.
    assert not any("acks" in secret or "dbname" in secret for secret in found), found


@pytest.mark.parametrize(
    "options",
    ["ssl_options=%7B'password':'QzxjVkqwSECRET'", "ssl_options=%7B'a&QzxjVkqwTail=1'%7D", "ssl_options=qzxj(vkqw"],
)
def test_malformed_pika_options_are_a_config_error_without_their_text(options: str) -> None:
    url = f"amqp://guest:guest@127.0.0.1:5672/%2F?{options}"
    with pytest.raises(ConfigError) as caught:
        connection_parameters(url, 5.0, 30, 5.0)
    assert "Qzxj" not in str(caught.value) and "qzxj" not in str(caught.value), caught.value


@pytest.mark.parametrize(
    "url",
    [
        "amqp://app:Xy/9Zq==@127.0.0.1/vh",  # base64: a '/' and a trailing '=' that looks like a query's
        "postgresql://app:Xy/9Zq==@127.0.0.1/shop",
        "kafka://app:qz?xj=wk@127.0.0.1:9092",
    ],
)
def test_an_equals_sign_in_a_cut_password_does_not_pass_for_a_query(url: str) -> None:
    assert ambiguity(url) is not None
    error = refuse(url)
    assert not shows_any(str(error), url.split("://")[1].rsplit("@", 1)[0].split(":", 1)[1]), error


def test_a_password_cut_by_two_spaces_stays_with_its_route() -> None:
    routes = split_routes("a.*=amqp://u:qzxj vqkw wkzq@127.0.0.1/vh  b.*=kafka://127.0.0.1:9092")
    assert routes == ["a.*=amqp://u:qzxj vqkw wkzq@127.0.0.1/vh", "b.*=kafka://127.0.0.1:9092"]
    with pytest.raises(ConfigError) as caught:
        parse_route(routes[0])
    assert not shows_any(str(caught.value), "qzxj vqkw wkzq"), caught.value


def test_keyword_options_with_spaces_around_the_equals_sign_are_not_taken_for_a_secret() -> None:
    found = secrets_in("host=db password=s3cretpw dbname = shop user = app sslmode= require")
    assert found == ["s3cretpw"]
    said = 'password authentication failed for user "app" on dbname shop'
    assert Scrubber(found)(said) == said


def test_a_passphrase_does_not_mask_common_words() -> None:
    scrub = Scrubber(["fly me to the moon"])
    assert scrub("could not connect to the server") == "could not connect to the server"
    assert "moon" not in scrub("password fly me to the moon was refused")


def test_a_long_secret_option_makes_a_small_scrubber_at_once() -> None:
    pem = "-----BEGIN CERTIFICATE-----\n" + "\n".join(["MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBa"] * 60)
    started = time.perf_counter()
    scrub = Scrubber(secrets_in("kafka://127.0.0.1:9092?ssl.ca.pem=" + quote(pem, safe="")))
    assert time.perf_counter() - started < 1.0
    assert "MIIDdzCCAl" not in scrub("bad pem: " + "\n".join(pem.splitlines()[:3]))


@pytest.mark.parametrize(
    "url", ["amqp://u:p@127.0.0.1:5672/vh\n", "  kafka://127.0.0.1:9092 ", "postgresql://u@127.0.0.1/db\r\n"]
)
def test_surrounding_whitespace_from_a_secret_file_is_dropped(url: str) -> None:
    assert ambiguity(url) is None
    if url.strip().startswith("postgresql"):
        assert check_database_url(url) == url.strip()
    else:
        parse_sink_url(url)


@pytest.mark.parametrize("value", ["'it's-qzxjvq'", "'qz'xjvqkw", "'qzxj'vqkw'"])
def test_a_keyword_password_cut_by_a_raw_quote_is_scrubbed_in_pieces(value: str) -> None:
    # libpq reads 'it' and then a keyword "s-qzxjvq'" with no '=': its error echoes that piece.
    dsn = f"host=db user=app password={value} dbname=shop"
    with pytest.raises(psycopg.ProgrammingError) as caught:
        psycopg.conninfo.conninfo_to_dict(dsn)
    said = Scrubber.of(dsn)(str(caught.value))
    assert "***" in said and not shows_any(said.replace("***", " "), value.replace("'", " ")), said


@pytest.mark.parametrize(
    "url", ["mariadb://:qzx:[Vjqk\\(Wkzq@[::1]:3306/shop", "postgresql://u:qz[Vjqk\\Wkzq@[::1]/shop"]
)
def test_a_piece_of_a_password_with_a_backslash_is_scrubbed_where_an_error_escapes_it(url: str) -> None:
    # urlsplit's error names the host it could not read by its repr: the backslash comes out doubled.
    refused = refuse(url)
    assert not shows_any(Scrubber.of(url)(str(refused)), url.split("@")[0].split(":", 2)[-1]), refused
