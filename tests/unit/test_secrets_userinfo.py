"""Every userinfo form a URL may carry: a token alone, a user alone, a user and a password.

A userinfo without ':' is a user name only for the schemes that put one there
(PostgreSQL, MySQL/MariaDB, AMQP); anywhere else it is a token, masked wherever
the URL is shown and scrubbed from free text (relay/secrets.py says why).
"""

from __future__ import annotations

import shlex
from urllib.parse import quote, unquote

import pytest

from relay.cli import _secrets_in_argv
from relay.config import parse_route, parse_sink_url
from relay.errors import ConfigError
from relay.secrets import Scrubber, redact_url, secrets_in, userinfo_is_secret

TOKEN = "Tkn9qzxv"

#: URLs whose userinfo is the token alone, in the spellings a user may write.
TOKEN_URLS = [
    f"kafka://{TOKEN}@broker:9092",
    f"KAFKA://{TOKEN}@broker:9092,other:9093?format=cloudevents",
    f"https://{TOKEN}@api.example/hook",
    f"http://{TOKEN}@api.example:8080/",
    f"nosuch://{TOKEN}@h/",
    f"redis://{TOKEN}@cache:6379/0",
    f"https://{quote(TOKEN + '/é@x', safe='')}@api.example/",  # percent-encoded, '@' and non-ASCII inside
    f"https://{TOKEN}é@api.example/",  # raw non-ASCII
    f"//{TOKEN}@api.example/path",  # a network-path reference: no scheme, so none that names a user
]

#: Schemes whose userinfo without ':' is a user name: shown as it is.
USER_URLS = [
    "amqp://Usrname1@rabbit/",
    "amqps://Usrname1@rabbit:5671/vhost",
    "AMQP://Usrname1@rabbit/",
    "postgresql://Usrname1@db/shop",
    "postgres://Usrname1@db/shop",
    "mysql://Usrname1@db:3306/shop",
    "mariadb://Usrname1@db/shop",
]


@pytest.mark.parametrize("url", TOKEN_URLS)
def test_a_token_alone_is_masked_and_scrubbed(url: str) -> None:
    shown = redact_url(url)
    assert TOKEN not in shown and "***@" in shown
    found = secrets_in(url)
    assert found, url
    scrub = Scrubber.of(url)
    for secret in found:  # as written and as a library that decoded it would echo it
        assert TOKEN not in scrub(f"login failed for {secret} ({unquote(secret)!r})")


@pytest.mark.parametrize("url", USER_URLS)
def test_a_user_alone_is_shown_where_the_scheme_names_a_user(url: str) -> None:
    assert redact_url(url) == url
    assert secrets_in(url) == []
    assert Scrubber.of(url)("user Usrname1 denied") == "user Usrname1 denied"


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("kafka://Usrname1:Pw0rd9xy@broker:9092", "Pw0rd9xy"),
        ("https://Usrname1:Pw0rd9xy@api.example/", "Pw0rd9xy"),
        ("amqp://Usrname1:Pw@rd9xy@rabbit/", "Pw@rd9xy"),  # a raw '@' in the password
        ("postgresql://Usrname1:P%40w%C3%B6rd9@db/shop", "P%40w%C3%B6rd9"),
        ("mysql://Usrname1:Pwörd9xy@db/shop", "Pwörd9xy"),
        ("https://:Pw0rd9xy@api.example/", "Pw0rd9xy"),  # a password alone
    ],
)
def test_a_user_and_a_password(url: str, password: str) -> None:
    shown = redact_url(url)
    assert password not in shown and ":***@" in shown
    assert password in secrets_in(url)
    assert "Pw" not in Scrubber.of(url)(f"bad password {password} (decoded: {password.replace('%40', '@')})")


@pytest.mark.parametrize(("scheme", "secret"), [("kafka", True), ("https", True), ("amqp", False), ("MySQL", False)])
def test_the_rule_by_scheme(scheme: str, secret: bool) -> None:
    assert userinfo_is_secret(scheme, "someone") is secret
    assert not userinfo_is_secret(scheme, "someone:pw")  # the password is what is masked then


def test_an_at_sign_in_a_query_is_no_token() -> None:
    """An e-mail in a query is past the authority: no userinfo, nothing scrubbed from free text."""
    assert secrets_in("https://api.example/x?email=me@corp.example") == []


@pytest.mark.parametrize("url", [u for u in TOKEN_URLS if u.lower().startswith("kafka://")])
def test_a_token_is_in_no_route_label_nor_error(url: str) -> None:
    assert TOKEN not in parse_route(f"orders.*={url}").label
    with pytest.raises(ConfigError) as caught:
        parse_sink_url(url.replace(":9092", ":port"))
    assert TOKEN not in str(caught.value)


@pytest.mark.parametrize("url", TOKEN_URLS[:6])
def test_a_token_is_masked_in_the_process_title(url: str) -> None:
    argv = ["outbox-relay", "run", "--sink", url]
    title = Scrubber(_secrets_in_argv(argv[1:]))(shlex.join(argv))
    assert TOKEN not in title


@pytest.mark.parametrize("url", USER_URLS)
def test_a_user_name_stays_in_the_process_title_and_route_labels(url: str) -> None:
    """Read with what precedes it (an argument pair read as one, a route's pattern), the scheme is still the URL's."""
    argv = ["outbox-relay", "run", "--database-url", url, "--sink", "kafka://h:9092"]
    assert Scrubber(_secrets_in_argv(argv[1:]))(shlex.join(argv)) == shlex.join(argv)
    assert redact_url(f"orders.*={url}") == f"orders.*={url}"


@pytest.mark.parametrize("text", ["ops@example.com", "order-7@shop", "--key ops@example.com"])
def test_an_address_is_no_url(text: str) -> None:
    """Without ``//`` an '@' is more likely an e-mail address or a key (``requeue --key``) than a userinfo's end."""
    assert secrets_in(text) == [] and redact_url(text) == text
