"""What is secret, decided in one place.

Two tools, used by every output path (errors, log messages and their
structured fields, metric labels, reprs, command output):

- :func:`redact_url` shows a URL (or a libpq keyword string) with its password
  and every secret option masked: for labels, reprs and error messages;
- :class:`Scrubber` removes known secrets from free text that a library may
  have echoed (an exception, a log line), in every spelling the secret may take
  there: as written, percent-decoded or encoded, escaped, or cut into pieces
  at the URL delimiters by a parser that misread it.

:func:`secrets_in` finds the secrets a scrubber needs in configuration text,
valid or not: a URL whose password holds a raw ``/``, ``?``, ``#`` or ``@`` is
invalid, and different parsers cut it in different places.

The userinfo of a URL (what precedes the ``@`` of its authority) is read by
its scheme. ``user:password`` is a user and a password in every scheme: the
password is secret, the user is shown. A userinfo without ``:`` is a user name
only for the schemes that put one there (:data:`USER_NAME_SCHEMES`: libpq's,
the MySQL client's, AMQP's, where a password-less user logs in by a
certificate, trust or a server-side rule); for any other scheme
(``kafka://TOKEN@host``, ``https://TOKEN@host`` as GitHub and many HTTP APIs
read it, a scheme the relay does not know) it is taken for a token, masked
and scrubbed as a password is. The safe side: a user name shown as ``***`` is
an inconvenience, a token shown is a leak.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, quote_plus, unquote, unquote_plus

MASK = "***"

#: Options librdkafka marks sensitive (``_RK_SENSITIVE`` in rdkafka_conf.c, plus
#: the OIDC ones newer versions add), spelled as the relay normalises names.
SENSITIVE_KAFKA_OPTIONS = frozenset(
    {
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.key",
        "ssl.keystore.password",
        "ssl.ca.pem",
    }
)
#: Words that make any option secret, whatever the library: passwords, tokens,
#: private keys (PostgreSQL's sslpassword and sslkey, pika's ssl_options).
_SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "credential",
    "private.key",
    "key.pem",
    "sslkey",
    "ssl.key",
    "keystore",
    "ssl.options",
    "api.key",
    "apikey",
    "jaas",
    "keytab",  # Kerberos keys (sasl.kerberos.keytab): a path, masked as ssl.key.location is
)
#: Option names that are secret when whole (``?key=``, ``?auth=`` of HTTP APIs), and parts of a name
#: (between '.', '_' or '-') that make it secret: too short to look for inside words (``sig`` in
#: "design"), and as parts of others they name no secret (libpq's ``require_auth``,
#: ``target_session_attrs``). Signed URLs' ``?sig=`` and ``X-Amz-Signature``.
_SECRET_NAMES = frozenset({"key", "auth", "pass", "pwd", "session", "sig", "signature"})
_SECRET_NAME_PARTS = frozenset({"sig", "signature", "authorization", "pwd"})
#: Schemes whose userinfo without a ':' is a user name (shown); in any other it is a token (masked).
USER_NAME_SCHEMES = frozenset({"postgresql", "postgres", "mysql", "mariadb", "amqp", "amqps"})
_SCHEME_AT_END = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*$")
#: Sensitive names whose values are masked where shown but not scrubbed from free
#: text: a user name such as "relay" would cut words out of every message.
_NAMES_NOT_SCRUBBED = frozenset({"sasl.username"})
_SECRET_NAME_WORDS = sorted({*_SECRET_WORDS, *(SENSITIVE_KAFKA_OPTIONS - _NAMES_NOT_SCRUBBED)}, key=len, reverse=True)
#: A secret option written without its '=' (``?sasl.passwordS3cret``): its value is glued to its
#: name, and every parser names the option it cannot read. The value is what follows the first
#: secret word, up to a '&' or a space in a URL, up to a space in a keyword string.
_GLUED_NAME = (
    r"(?:(?<=[?&;\s])|^)(?P<name>[\w.\-]*?(?:"
    + "|".join(re.escape(word).replace(r"\.", r"[._\-]") for word in _SECRET_NAME_WORDS)
    + "))"
)
_GLUED = re.compile(_GLUED_NAME + r"(?P<value>[^&\s=]+)(?=[&\s]|$)", re.IGNORECASE)
_GLUED_KEYWORD = re.compile(_GLUED_NAME + r"(?P<value>[^\s=]+)(?=\s|$)", re.IGNORECASE)
#: A secret cut at these characters (by a parser that took a raw one for a
#: delimiter) may be echoed in pieces; pieces this long or longer are scrubbed.
#: '[' and ']' too: urlsplit echoes what it finds between them as an IPv6 host it cannot read;
#: and "'": libpq ends a quoted keyword value at a raw one, and echoes the rest as a keyword.
_DELIMITERS = re.compile(r"[/?#@:&=;,\[\]'\s]+")
_URL_DELIMITER_GROUPS = re.compile(r"([/?#@:&=;,\[\]']+)")
#: Runs of pieces are made of secrets up to this long, of at most this many pieces.
SPAN_FORM_MAX_CHARS = 128
SPAN_MAX_PIECES = 6
MIN_PIECE_CHARS = 4
# ``name=value`` in a URL query or a libpq keyword string (the name perhaps percent-encoded): up to
# a '&' or a space, and a quoted part may hold spaces. Not cut at '#' or ';': a raw one in a
# password is part of it to whoever wrote it, and what follows it would be shown.
_OPTION = re.compile(r"(?P<name>[A-Za-z%][\w.\-%]*)(?P<eq>\s*=\s*)(?P<value>(?:'(?:\\.|[^'\\])*'|[^&\s])*)")
#: The same in a libpq keyword string (no ``scheme://``), where only a space ends a value: a '&' is
#: part of it, and so is a space escaped with a backslash.
_KEYWORD_OPTION = re.compile(r"(?P<name>[A-Za-z%][\w.\-%]*)(?P<eq>\s*=\s*)(?P<value>(?:'(?:\\.|[^'\\])*'|\\.|\S)*)")
#: The ``PATTERN=`` of a ``PATTERN=URL`` route (at the start, or after a space in RELAY_ROUTES).
_ROUTE_PATTERN = re.compile(r"(?:^|(?<=\s))[^=\s]+=(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
_AUTHORITY_END = re.compile(r"[/?#]")
_QUERY_START = re.compile(r"[?]")
#: After a secret option's value: chunks cut off by a raw '&' or space, each without '=' (so not an
#: option), or starting with '=', '#' or ';' (so no option's name: ``password=ab =cd``, ``ab&;cd``);
#: a raw '#' or ';' inside a chunk is part of the secret too (``ab !cd;ef``).
_CONTINUATION = re.compile(r"(?:[&\s]+(?:[=#;][^&\s]*|[^&\s=]+)(?=[&\s]|$)(?!\s*=))+")
_CUTS = "& \t\r\n"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
#: A keyword string starts with ``name=``; a text that does not, yet has an '@', may be a URL that lost
#: its ``//`` (``postgresql:app:pw@host``, ``//app:pw@host``, ``app:pw@host``).
_KEYWORD_START = re.compile(r"\s*[A-Za-z][\w.\-]*\s*=")
_SCHEME_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def ambiguity(url: str) -> str | None:
    """Why ``url`` cannot be read without guessing where its password ends; None when it can.

    A password (or a value) holding a raw ``/``, ``?``, ``#`` or a space is cut
    there by every parser, each in its own place, and their errors then echo the
    pieces. An ``@`` after the authority is taken for such a cut unless it lies
    in the query of a URL whose hosts read as hosts (``?sasl.username=me@corp``).
    A libpq keyword string (no ``scheme://``) is not judged here.
    """
    url = url.strip()
    if not _SCHEME.match(url):
        return None
    if any(c.isspace() for c in url):
        return "holds a space or a line break (percent-encode it as %20 in a password or a name)"
    scheme, rest = url.split("://", 1)
    # The relay reads a kafka:// URL's hosts up to the '?' itself: a raw '/' or '#' in its password is read right.
    kafka = scheme.lower() == "kafka"
    at, end = rest.rfind("@"), (_QUERY_START if kafka else _AUTHORITY_END).search(rest)
    if at >= 0 and end is not None and end.start() < at and not _query_at(rest, end.start(), at):
        after = "'?'" if kafka else "'/', '?' or '#'"
        return f"has an '@' after {after}: percent-encode those in a password or user (/ %2F, ? %3F, # %23, @ %40)"
    if "#" in rest and not kafka:
        return "holds a '#', which ends a URL: percent-encode it (%23) in a password or a value"
    return None


def _query_at(rest: str, end: int, at: int) -> bool:
    """Whether the ``@`` at ``at`` is in a query's ``name=value`` (an e-mail), not past a cut password."""
    stretch = rest[end:at]
    query = stretch.find("?")
    if query < 0 or "=" not in stretch[query:] or "#" in stretch[:query]:
        return False
    authority = rest[:end]
    hosts = authority.rpartition("@")[2].split(",")
    # "user:pass" read as a host: its "port" is no number.
    return all(not host or host.startswith("[") or _HOST.match(host) for host in hosts)


_HOST = re.compile(r"^[^:/?#@\[\]]*(?::\d*)?$")


def normalise_option(name: str) -> str:
    """An option name as the relay compares it: lower case, ``_`` and ``-`` read as ``.``."""
    return name.strip().lower().replace("_", ".").replace("-", ".")


def is_secret_option(name: str) -> bool:
    """Whether the value of option ``name`` (any library, either spelling) is masked where shown."""
    # Percent-decoded too: a URL's reader decodes its query's names (``pass%77ord``).
    return any(
        normal in SENSITIVE_KAFKA_OPTIONS
        or any(word in normal for word in _SECRET_WORDS)
        or normal in _SECRET_NAMES
        or not _SECRET_NAME_PARTS.isdisjoint(normal.split("."))
        for normal in {normalise_option(name), normalise_option(unquote_plus(name))}
    )


def userinfo_is_secret(scheme: str, userinfo: str) -> bool:
    """Whether the userinfo of a ``scheme://userinfo@host`` URL is masked whole: it holds no ``:``
    (so no separate password) and ``scheme`` does not put a user name there (see the module's text)."""
    # What precedes the scheme is no part of it: a flag before it (``--database-url postgresql``, an
    # argument pair read as one), a route's pattern (``orders.*=kafka``).
    found = _SCHEME_AT_END.search(scheme)
    return ":" not in userinfo and (found is None or found.group().lower() not in USER_NAME_SCHEMES)


def _is_scrubbed_option(name: str) -> bool:
    return is_secret_option(name) and normalise_option(name) not in _NAMES_NOT_SCRUBBED


def _options_of(text: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """How options (``name=value``, and glued ``nameVALUE``) are read in ``text``: a URL's query,
    or a libpq keyword string."""
    return (_OPTION, _GLUED) if "://" in text else (_KEYWORD_OPTION, _GLUED_KEYWORD)


def _mask_options(text: str) -> str:
    def mask(match: re.Match[str]) -> str:
        if not is_secret_option(match["name"]) or not match["value"]:
            return match[0]
        return f"{match['name']}{match['eq']}{MASK}"

    options, glued_options = _options_of(text)

    def masked(part: str) -> str:
        return glued_options.sub(lambda glued: f"{glued['name']}{MASK}", options.sub(mask, part))

    # A route's pattern is shown as it is: it is no option, whatever words it holds ("secrets.*").
    shown, last = [], 0
    for route in _ROUTE_PATTERN.finditer(text):
        shown += [masked(text[last : route.start()]), route[0]]
        last = route.end()
    return "".join([*shown, masked(text[last:])])


def _bare_userinfo(text: str) -> str | None:
    """What precedes the last ``@`` of a text that reads as a URL without its ``scheme://``; None for
    a URL or a keyword string. libpq takes such a text for a keyword string and echoes it whole."""
    if "://" in text or "@" not in text or _KEYWORD_START.match(text):
        return None
    return text.strip().rpartition("@")[0]


def _bare_token(userinfo: str) -> bool:
    """Whether a bare ``userinfo`` is a token: the userinfo of a network-path reference (``//tok@host``),
    with no ``:`` and so no scheme that puts a user name there. (Without the ``//``, ``ops@example.com``
    is more likely an address, or a key, than a URL.)"""
    return userinfo.startswith("//") and ":" not in userinfo and bool(userinfo.strip("/"))


def _bare_passwords(userinfo: str) -> list[str]:
    """The passwords ``userinfo`` may hold: after its first ``:``, and after a leading ``scheme:`` too
    (whether ``postgresql:app:pw`` begins with a scheme or with a user, only its writer knows)."""
    if _bare_token(userinfo):
        return [userinfo.strip("/")]
    found = [userinfo.lstrip("/").partition(":")[2]]
    scheme = _SCHEME_PREFIX.match(userinfo)
    if scheme is not None:
        found.append(userinfo[scheme.end() :].lstrip("/").partition(":")[2])
    return found


def shown_before_space(url: str) -> str:
    """:func:`redact_url` of ``url``, up to its first whitespace, for the error refusing a URL that holds some.

    A raw space cuts a secret value, and a piece after it that reads like an
    option (``sasl.password=ab cd=&acks=all``) cannot be told from one, so
    nothing past the first whitespace left by the redaction is shown.
    """
    redacted = redact_url(url)
    head = re.split(r"\s", redacted, maxsplit=1)[0]
    return head if head == redacted else f"{head} ..."


def redact_url(url: str) -> str:
    """``url`` with its password and secret options replaced by ``***``.

    Works on anything: a valid URL keeps its user, host, path and other
    options; when the password may hold a raw ``/``, ``?`` or ``#`` (so the
    authority cannot be told apart from the path), everything up to the last
    ``@`` is masked. A libpq keyword string has its secret keywords masked.
    """
    text = _mask_options(url)
    scheme, separator, rest = text.partition("://")
    if not separator:
        bare = _bare_userinfo(text)
        if bare is None or not (":" in bare or _bare_token(bare)):
            return text
        return f"{MASK}@{text.strip().rpartition('@')[2]}"
    at = rest.rfind("@")
    if at < 0:
        return text
    end = _AUTHORITY_END.search(rest)
    if (end is not None and end.start() < at) or userinfo_is_secret(scheme, rest[:at]):
        shown = MASK
    else:
        user, colon, _ = rest[:at].partition(":")
        shown = f"{user}:{MASK}" if colon else user
    return f"{scheme}://{shown}@{rest[at + 1 :]}"


def holds_secret(reference: str) -> bool:
    """Whether URI-reference ``reference`` holds anything this module classes as secret: a
    password or a userinfo that is a token (:func:`userinfo_is_secret`) in its authority, or a
    secret option (``?password=``, ``?sig=``, ``#access_token=``) in its query or fragment.

    Only a reference with an authority (``scheme://``, ``//``) has a userinfo: the ``@`` of
    ``mailto:ops@example.com`` is part of an address.
    """
    head, _, fragment = reference.partition("#")
    head, _, query = head.partition("?")
    scheme, separator, rest = ("x:" + head if head.startswith("//") else head).partition("://")
    authority = _AUTHORITY_END.split(rest, maxsplit=1)[0]
    if separator and "@" in authority:
        userinfo = authority.rpartition("@")[0]
        if ":" in userinfo or userinfo_is_secret(scheme, userinfo):
            return True
    for options in (query, fragment):
        probe = "x://h?" + options
        if options and _mask_options(probe) != probe:
            return True
    return False


def secrets_in(text: str) -> list[str]:
    """The secrets in configuration ``text``: a URL (valid or not), a ``PATTERN=URL``
    route or a libpq keyword string. The password is read as everything between
    the scheme's ``//`` and the last ``@``, which covers what any parser takes it for."""
    found: list[str] = []
    text = _ROUTE_PATTERN.sub("", text)  # a route's pattern is no option, whatever words it holds
    scheme, separator, rest = text.partition("://")
    if separator:
        userinfo, at, _ = rest.rpartition("@")
        _, colon, password = userinfo.partition(":")
        if at and colon:
            found.append(password)
        elif at and userinfo_is_secret(scheme, userinfo) and not _AUTHORITY_END.search(userinfo):
            # (an '@' past the authority is in a path or a query: ``?email=me@corp``)
            found.append(userinfo)
    else:
        bare = _bare_userinfo(text)
        if bare is not None:
            found += _bare_passwords(bare)
    options, glued_options = _options_of(text)
    found += [glued["value"] for glued in glued_options.finditer(text)]
    for match in options.finditer(text):
        if _is_scrubbed_option(match["name"]):
            found.append(_unquote_keyword(match["value"]))
            # A raw '&' or space in the value cuts it: what follows, up to the next name=value, is the rest of it.
            more = _CONTINUATION.match(text, match.end())
            if more is not None and more.group(0).strip(_CUTS):
                found.append(match["value"] + more.group(0).rstrip(_CUTS))
                found += [chunk for chunk in re.split(r"[&\s]+", more.group(0)) if chunk]
    return [secret for secret in found if secret]


def secrets_of_options(options: Mapping[str, str]) -> list[str]:
    """The values of the secret options in ``options`` (a sink's library settings)."""
    return [value for name, value in options.items() if value and _is_scrubbed_option(name)]


def _unquote_keyword(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def spellings(secret: str) -> set[str]:
    """Every form in which ``secret`` may appear in a library's text."""
    decoded = unquote(secret)
    # Bytes that are not UTF-8 (a shell's argument, escaped by Python) are quoted as the bytes they were.
    quoted = quote(decoded, safe="", errors="surrogateescape"), quote_plus(decoded, errors="surrogateescape")
    forms = {secret, decoded, unquote_plus(secret), *quoted}
    forms |= {repr(decoded)[1:-1], decoded.encode("unicode_escape").decode("ascii"), json.dumps(decoded)[1:-1]}
    forms.add(decoded.replace("\\", "\\\\").replace("'", "\\'"))  # libpq's keyword quoting
    # Pieces of the escaped form too: an error that names a piece by its repr doubles its backslashes.
    for form in (secret, decoded, repr(decoded)[1:-1], decoded.replace("\\", "\\\\")):
        forms |= {piece for piece in _DELIMITERS.split(form) if len(piece) >= MIN_PIECE_CHARS}
        forms |= _spans(form)
    return {form for form in forms if form}


def _spans(form: str) -> set[str]:
    """The runs of whole pieces of ``form`` with the URL delimiters between them (``ss/w:rd`` of
    ``p@ss/w:rd#1``): a parser that cut the secret elsewhere echoes such a run, whose pieces
    alone are too short to scrub. Not across spaces (a passphrase's "to the" is any text's), and
    only for a password-sized ``form`` (a PEM's runs would number in the millions)."""
    if len(form) > SPAN_FORM_MAX_CHARS:
        return set()
    runs: set[str] = set()
    for word in form.split():
        parts = _URL_DELIMITER_GROUPS.split(word)  # piece, delimiters, piece, ...
        pieces = range(0, len(parts), 2)
        runs |= {"".join(parts[i : j + 1]) for i in pieces for j in pieces if i < j <= i + 2 * SPAN_MAX_PIECES}
    return {run for run in runs if len(run) >= MIN_PIECE_CHARS}


class Scrubber:
    """Replaces known secrets, in every spelling, with ``***`` in free text."""

    __slots__ = ("_pattern",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret:
                forms |= spellings(secret)
        # Longest first, so a secret is masked whole rather than piece by piece.
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @classmethod
    def of(cls, *texts: str | None) -> Scrubber:
        """A scrubber for the secrets in configuration ``texts`` (see :func:`secrets_in`)."""
        return cls(secret for text in texts if text for secret in secrets_in(text))

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __call__(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***``."""
        return self._pattern.sub(MASK, text) if self._pattern is not None else text

    def __repr__(self) -> str:
        return f"Scrubber({'some' if self else 'no'} secrets)"


def one_line(text: str, scrub: Scrubber) -> str:
    """``text`` scrubbed and on one line, for an error message."""
    return " ".join(scrub(text).split())


__all__ = [
    "MASK",
    "Scrubber",
    "ambiguity",
    "holds_secret",
    "is_secret_option",
    "normalise_option",
    "one_line",
    "redact_url",
    "secrets_in",
    "secrets_of_options",
    "spellings",
    "userinfo_is_secret",
]
