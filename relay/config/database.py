"""The database URL: a libpq URL or keyword string, or a ``mysql://`` one, checked before any
driver sees it (a driver's error would echo it whole, password and all)."""

from __future__ import annotations

from urllib.parse import urlsplit

from relay.errors import ConfigError
from relay.secrets import Scrubber, ambiguity, redact_url, shown_before_space

#: The URL schemes of the MySQL 8 / MariaDB store (relay.store.mysql).
MYSQL_SCHEMES = ("mysql", "mariadb")


def is_mysql_url(url: str) -> bool:
    """Whether ``url`` is a ``mysql://`` or ``mariadb://`` URL."""
    return "://" in url and url.split("://", 1)[0].lower() in MYSQL_SCHEMES


def check_database_url(url: str) -> str:
    """Return ``url`` if it looks like a libpq URL or keyword string, or a ``mysql://`` URL."""
    url = url.strip()  # a value read from a file often ends in a line break
    if not url:
        raise ConfigError("no database configured: set --database-url, RELAY_DATABASE_URL or DATABASE_URL")
    if any("\ud800" <= char <= "\udfff" for char in url):
        # Python keeps bytes that are not UTF-8 (a shell's argument, a variable) as lone surrogates;
        # libpq would fail on them with a traceback, and the password may be among them: not echoed.
        raise ConfigError(
            "invalid database URL: it holds bytes that are not UTF-8 (write it in UTF-8, percent-encode the rest)"
        )
    if "://" not in url and "=" not in url:
        # Neither a URL nor a keyword string (a URL that lost its '//', a password set in its place):
        # libpq's error would echo it whole, whatever secret it holds.
        raise ConfigError(
            "invalid database URL: neither scheme://... (postgresql://, mysql://) nor libpq's keyword=value pairs"
        )
    if "://" in url:
        problem = ambiguity(url)
        if problem is not None:
            raise ConfigError(f"invalid database URL {shown_before_space(url)!r}: it {problem}")
        scheme, rest = url.split("://", 1)
        url = f"{scheme.lower()}://{rest}"  # libpq takes the scheme in lower case only
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - urlsplit checks the port lazily
        except ValueError as exc:
            raise ConfigError(f"invalid database URL {redact_url(url)!r}: {Scrubber.of(url)(str(exc))}") from None
        if parts.scheme not in ("postgresql", "postgres", *MYSQL_SCHEMES):
            raise ConfigError(
                f"unknown database URL scheme {parts.scheme!r} in {redact_url(url)!r}: use postgresql:// or mysql://"
            )
    return url
