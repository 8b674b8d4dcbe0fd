"""What is secret: a canary password in every spelling, through every in-process output path.

The CLI's own output (one-line errors, JSON logs, /metrics, status and dead)
is checked as a subprocess in tests/acceptance/test_secrets.py.
"""

from __future__ import annotations

import io
import json
import logging
from urllib.parse import quote, unquote

import pytest

from relay.app import RunConfig, build_relay
from relay.config import (
    KafkaSinkConfig,
    RelaySettings,
    TableName,
    is_secret_option,
    parse_route,
    parse_sink_url,
    redact_url,
    resolve_routes,
)
from relay.errors import ConfigError
from relay.logs import JsonFormatter, ScrubSecrets
from relay.metrics import Metrics
from relay.secrets import Scrubber, shown_before_space
from relay.sinks import build_router

#: Every piece of every canary holds this marker, so a canary cut into pieces by
#: a parser that misread a raw delimiter is still found.
MARK = "Cnry"

#: The password in every form a user may write it in a URL.
PASSWORDS = {
    "raw slash": "Cnry1/Cnry2",
    "raw at": "Cnry1@Cnry2",
    "raw colon": "Cnry1:Cnry2",
    "raw hash": "Cnry1#Cnry2",
    "raw question mark": "Cnry1?Cnry2",
    "every raw delimiter": "Cnry1/Cnry2@Cnry3:Cnry4#Cnry5?Cnry6",
    "percent-encoded": "Cnry1%2FCnry2%40Cnry3%3ACnry4%23Cnry5%3FCnry6",
    "non-ASCII": "Cnry1üß€Cnry2",
    "percent-encoded non-ASCII": "Cnry1%C3%BC%E2%82%ACCnry2",
    # urlsplit echoes what lies between brackets as an IPv6 host it cannot read.
    "raw brackets": "Cnry1[Cnry2]Cnry3",
    "raw semicolon": "Cnry1;Cnry2",
    "raw quote": "Cnry1'Cnry2",
}
#: Where a password goes, by kind of URL.
URLS = {
    "postgresql": "postgresql://app:{pw}@db.example:5432/shop",
    "mysql": "mysql://app:{pw}@db.example:3306/shop",
    "amqp": "amqp://relay:{pw}@mq.example:5672/vhost?exchange=events",
    "kafka": "kafka://relay:{pw}@k1.example:9092,k2.example:9092",
}
#: Options whose values are secret although most of their names hold no "password":
#: every option librdkafka marks sensitive, and PostgreSQL's.
SECRET_OPTIONS = [
    "sasl.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "ssl.key.pem",
    "ssl.key.password",
    "ssl.key.location",
    "ssl.keystore.password",
    "ssl.ca.pem",
    "sslpassword",
    # A keytab holds Kerberos keys: masked like ssl.key.location, a path to a private key.
    "sasl.kerberos.keytab",
]
PLAIN_OPTIONS = ["bootstrap.servers", "linger.ms", "sasl.mechanism", "client.id", "security.protocol", "exchange"]


def leaks(text: str) -> bool:
    """Whether ``text`` shows any piece of a canary, as written or percent-decoded."""
    return MARK in text or MARK in unquote(text)


def both_spellings(name: str) -> list[str]:
    return [name, name.replace(".", "_")]


@pytest.mark.parametrize("password", PASSWORDS.values(), ids=PASSWORDS.keys())
@pytest.mark.parametrize("template", URLS.values(), ids=URLS.keys())
def test_redact_url_hides_a_password_in_every_form(template: str, password: str) -> None:
    url = template.format(pw=password)
    shown = redact_url(url)
    assert not leaks(shown), shown
    assert shown.startswith(url.split("://")[0] + "://") and "example" in shown, shown


@pytest.mark.parametrize("password", PASSWORDS.values(), ids=PASSWORDS.keys())
@pytest.mark.parametrize(
    "template",
    [
        "postgresql:app:{pw}@db.example/shop",
        "postgresql:/app:{pw}@db.example/shop",
        "postgresql//app:{pw}@db.example/shop",
        "//app:{pw}@db.example/shop",
        "app:{pw}@db.example/shop?sslmode=require",
    ],
)
def test_a_url_that_lost_its_slashes_is_redacted_and_scrubbed(template: str, password: str) -> None:
    # libpq reads such a text as a keyword string, and its error echoes the text whole.
    url = template.format(pw=password)
    shown = redact_url(url)
    assert not leaks(shown) and shown.endswith("db.example/shop" + url.partition("/shop")[2]), shown
    said = f'missing "=" after "{url}" in connection info string'
    assert not leaks(Scrubber.of(url)(said)), Scrubber.of(url)(said)


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://app@db.example/shop?password{pw}",
        "postgresql://app@db.example/shop?sslmode=require&sslpassword{pw}",
        "host=db.example user=app password{pw} dbname=shop",
        "host=db.example user=app password{pw}&Cnry3 dbname=shop",
        "mysql://app@db.example/shop?ssl_key_password{pw}",
        "amqp://u@mq.example/%2F?exchange=x&token{pw}",
        "kafka://k.example:9092?sasl.password{pw}&acks=all",
        "kafka://k.example:9092?SASL_OAUTHBEARER_CONFIG{pw}",
        "billing.*=kafka://k.example:9092?ssl.key.password{pw}",
    ],
)
def test_a_secret_option_glued_to_its_value_is_masked_and_scrubbed(text: str) -> None:
    # An option written without its '=': each parser names the option it cannot read, value and all.
    for password in ("Cnry1", "Cnry1-token-Cnry2", "Cnry1%2FCnry2"):
        glued = text.format(pw=password)
        assert not leaks(redact_url(glued)), redact_url(glued)
        name = glued.split("?")[-1].split("&")[-1] if "?" in glued else glued.split()[2]
        said = Scrubber.of(glued)(f"unknown option {name!r} in {glued}")
        assert not leaks(said) and "example" in said, said


@pytest.mark.parametrize("password", ["pw", "Cnry1%2FCnry2", "Cnry1:Cnry2", "Cnry1üCnry2"])
def test_a_valid_url_keeps_its_user_host_and_plain_options(password: str) -> None:
    url = f"postgresql://app:{password}@db.example:5432/shop?sslmode=require&sslpassword={password}"
    assert redact_url(url) == "postgresql://app:***@db.example:5432/shop?sslmode=require&sslpassword=***"
    assert redact_url("amqp://guest@h/") == "amqp://guest@h/"


@pytest.mark.parametrize("name", [n for option in SECRET_OPTIONS for n in both_spellings(option)])
def test_every_secret_option_is_masked_in_either_spelling(name: str) -> None:
    assert is_secret_option(name)
    password = quote(PASSWORDS["every raw delimiter"], safe="")
    url = f"kafka://k1.example:9092?linger.ms=5&{name}={password}&client.id=relay"
    shown = redact_url(url)
    assert not leaks(shown) and "linger.ms=5" in shown and "client.id=relay" in shown, shown
    if name != "sslpassword":  # PostgreSQL's, not an option of Kafka
        assert not leaks(repr(parse_sink_url(url)))


@pytest.mark.parametrize("name", PLAIN_OPTIONS)
def test_plain_options_are_shown(name: str) -> None:
    assert not is_secret_option(name)


def parsed_routes(texts: list[str]) -> list[str]:
    """The routes among ``texts`` that parse: a raw delimiter makes some URLs invalid (see below)."""
    valid = []
    for text in texts:
        try:
            parse_route(text)
        except ConfigError:
            continue
        valid.append(text)
    return valid


@pytest.mark.parametrize("password", PASSWORDS.values(), ids=PASSWORDS.keys())
def test_no_repr_and_no_sink_label_shows_a_route_password(password: str) -> None:
    encoded = quote(unquote(password), safe="")
    routes = resolve_routes(
        [
            *parsed_routes(
                [f"billing.*=amqp://u:{password}@mq.example:5672/", f"kafka.*=kafka://u:{password}@k3:9092"]
            ),
            f"payments.*=amqp://u:{encoded}@mq.example:5672/",
            f"audit=kafka://k1.example:9092?sasl.oauthbearer.config={encoded}&ssl_key_pem={encoded}",
        ],
        f"kafka://relay:{encoded}@k2.example:9092",
    )
    config = RunConfig(
        f"postgresql://app:{password}@db.example/shop", TableName.parse("outbox"), None, RelaySettings(), routes=routes
    )
    router = build_router(routes, publish_timeout_seconds=1)
    metrics = Metrics()
    metrics.track_sinks(router.states)
    shown = [repr(config), repr(router), *router.states(), metrics.render().decode(), *(r.label for r in routes)]
    assert not [text for text in shown if leaks(text)], shown


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db.example dbname=shop password='Cnry1 Cnry2' sslpassword=Cnry3",
        # '&' separates nothing in a keyword string: libpq takes it as part of the password.
        "host=db.example dbname=shop password=Cnry1&Cnry2 sslmode=disable",
        "host=db.example dbname=shop sslpassword=Cnry1&Cnry2&Cnry3",
        "host=db.example dbname=shop password=Cnry1\\ Cnry2 sslmode=disable",  # an escaped space
    ],
)
def test_no_repr_of_a_built_relay_shows_a_keyword_dsn_password(dsn: str) -> None:
    config = RunConfig(dsn, TableName.parse("outbox"), parse_sink_url("kafka://k:1"), RelaySettings())
    relay = build_relay(config)
    shown = [repr(config), repr(relay.store), repr(relay.sink)]
    assert not [text for text in shown if leaks(text)], shown


@pytest.mark.parametrize("password", PASSWORDS.values(), ids=PASSWORDS.keys())
@pytest.mark.parametrize(
    "bad",
    [
        "postgresql://app:{pw}@db.example:99999/shop",
        "amqp://u:{pw}@mq.example:99999/",
        "amqp://u:{pw}@/",
        "kafka://u:{pw}@nohostport",
        "nosuch://u:{pw}@h:1/",
        "billing.*=amqp://u:{pw}@h:99999/",
    ],
)
def test_a_config_error_never_shows_the_password(bad: str, password: str) -> None:
    from relay.config import check_database_url

    text = bad.format(pw=password)
    with pytest.raises(ConfigError) as caught:
        if text.startswith("postgresql"):
            check_database_url(text)
        elif text.startswith("billing"):
            parse_route(text)
        else:
            parse_sink_url(text)
    assert not leaks(str(caught.value)), caught.value


def json_log(record_extra: dict[str, object], message: str, secrets: list[str]) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ScrubSecrets(secrets))
    logger = logging.getLogger("tests.secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(message, extra=record_extra)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


class _Opaque:
    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return f"opaque({self.text})"


@pytest.mark.parametrize("password", PASSWORDS.values(), ids=PASSWORDS.keys())
def test_json_logs_scrub_the_structured_fields_too(password: str) -> None:
    decoded = unquote(password)
    url = f"amqp://u:{password}@mq.example:5672/"
    line = json_log(
        {"action": "x", "sink": url, "error": _Opaque(decoded), "attempt": 2},
        f"lost {decoded}",
        [password],
    )
    entry = json.loads(line)
    assert not leaks(line) and not leaks(json.dumps(entry, ensure_ascii=False)), line
    assert entry["attempt"] == 2 and entry["action"] == "x"


@pytest.mark.parametrize("name", SECRET_OPTIONS)
def test_a_kafka_config_repr_masks_every_secret_option(name: str) -> None:
    config = KafkaSinkConfig("k:1", {name: "Cnry1", "linger.ms": "5"})
    assert not leaks(repr(config)) and "'linger.ms': '5'" in repr(config)


#: A secret option's value with a raw character that ends no query value, in the places it is written.
RAW_VALUE_TEXTS = [
    "kafka://k1.example:9092?sasl.password={pw}&client.id=relay",
    "kafka://k1.example:9092?ssl.key.password={pw}",
    "postgresql://app@db.example/shop?password={pw}",
    "postgresql://app@db.example/shop?sslpassword={pw} x",
    "host=db.example password={pw} dbname=shop",
    "mysql://app@db.example/shop?ssl-key=/keys/{pw}",
]


@pytest.mark.parametrize("value", ["Cnry1;Cnry2", "Cnry1#Cnry2", "'Cnry1'Cnry2", "Cnry1'Cnry2", "Cnry1;Cnry2#Cnry3"])
@pytest.mark.parametrize("template", RAW_VALUE_TEXTS)
def test_a_secret_value_is_masked_and_scrubbed_past_a_raw_semicolon_hash_or_quote(template: str, value: str) -> None:
    text = template.format(pw=value)
    assert not leaks(redact_url(text)), redact_url(text)
    assert not leaks(Scrubber.of(text)(f"error in {text}: {value} {unquote(value)}")), text


@pytest.mark.parametrize("pattern", ["secrets.*", "tokens", "api-key.events", "password-resets.*"])
def test_a_route_pattern_is_no_option_whatever_words_it_holds(pattern: str) -> None:
    """Taken for a secret option, the pattern's "value" (the whole URL) would scrub the broker's host from every log."""
    route = f"{pattern}=kafka://broker.example:9092?client.id=relay&sasl.password=Cnry1;Cnry2"
    scrub = Scrubber.of(route)
    assert scrub("connected to broker.example:9092 as relay") == "connected to broker.example:9092 as relay"
    assert not leaks(scrub("Cnry1;Cnry2")) and not leaks(redact_url(route))
    assert redact_url(route).startswith(f"{pattern}=kafka://broker.example:9092?client.id=relay&sasl.password=***")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("kafka://h:1?sasl.password=ab cd=&acks=all", "kafka://h:1?sasl.password=*** ..."),
        ("amqp://u:ab cd@h/", "amqp://u:***@h/"),
        ("kafka://h:1?acks=all", "kafka://h:1?acks=all"),
        ("postgresql://u@h/db?application_name=a b&password=cd", "postgresql://u@h/db?application_name=a ..."),
    ],
)
def test_a_url_refused_for_a_space_is_shown_up_to_it(url: str, shown: str) -> None:
    assert shown_before_space(url) == shown
