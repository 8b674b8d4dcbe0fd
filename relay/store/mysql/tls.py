"""TLS to MySQL 8 and MariaDB, from the options of a ``mysql://`` URL.

The options take the MySQL client's names (``mysql --ssl-mode=VERIFY_CA
--ssl-ca=...``), written as query parameters:
``mysql://user:pass@host:3306/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/etc/ssl/rds.pem``.

- ``ssl-mode``: ``DISABLED`` (the default: plain TCP, as before these
  options), ``REQUIRED`` (encrypted, the server's certificate not checked),
  ``VERIFY_CA`` (signed by ``ssl-ca``, or by the system's CAs without it),
  ``VERIFY_IDENTITY`` (that, and issued for the URL's host). ``PREFERRED`` is
  refused: it falls back to plain text without saying so.
- ``ssl-ca``: the CA certificates (PEM) the server's must chain to; given
  without ``ssl-mode``, it means ``VERIFY_CA``, as for the MySQL client.
- ``ssl-cert`` and ``ssl-key``: a client certificate and its key (PEM), for
  accounts created ``REQUIRE X509``.
- ``ssl-key-password-file``: a file whose first line is the passphrase of an
  encrypted ``ssl-key`` (a mounted secret; never the passphrase itself in the
  URL). An encrypted key without it is a one-line error at start-up: OpenSSL
  would otherwise ask for it on the terminal, inside the event loop (a relay
  started from a shell hung there; without a terminal it failed with "[Errno
  22] Invalid argument").

The context is built once, from the files as they are at start-up, and
shared by every connection.

A server that cannot do TLS fails the connection whenever TLS is asked for:
the drivers never fall back to plain text.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from enum import Enum

from relay.errors import ConfigError


class SslMode(Enum):
    DISABLED = "DISABLED"
    REQUIRED = "REQUIRED"
    VERIFY_CA = "VERIFY_CA"
    VERIFY_IDENTITY = "VERIFY_IDENTITY"


#: The URL options, by their MySQL client names; ``ssl_mode`` and the like are read the same.
OPTIONS = ("ssl-mode", "ssl-ca", "ssl-cert", "ssl-key", "ssl-key-password-file")


class _NoPassphrase(Exception):
    """Raised by the passphrase callback when none was given: OpenSSL must never prompt for one."""


@dataclass(frozen=True, slots=True)
class Tls:
    """How to encrypt the connections: a mode and the files it reads (paths, no secrets)."""

    mode: SslMode = SslMode.DISABLED
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    #: A file holding the passphrase of an encrypted ``key``.
    key_password_file: str | None = None
    #: The context once built (see :meth:`context`): one for every connection.
    _built: list[ssl.SSLContext | None] = field(default_factory=list, repr=False, compare=False, hash=False)

    @classmethod
    def from_options(cls, options: list[tuple[str, str]], *, where: str) -> Tls:
        """The TLS settings of a URL's query options; ``ConfigError`` (naming ``where``) for anything else."""
        found: dict[str, str] = {}
        for raw, value in options:
            name = raw.strip().lower().replace("_", "-")
            if name not in OPTIONS:
                supported = ", ".join(OPTIONS)
                raise ConfigError(f"MySQL URL {where}: unknown option {raw[:40]!r} (supported: {supported})")
            if name in found:
                raise ConfigError(f"MySQL URL {where}: option {name} is given twice")
            if not value:
                raise ConfigError(f"MySQL URL {where}: option {name} needs a value")
            found[name] = value
        mode_text = found.get("ssl-mode")
        if mode_text is None:
            mode = SslMode.VERIFY_CA if "ssl-ca" in found else SslMode.DISABLED
        elif mode_text.upper() == "PREFERRED":
            raise ConfigError(
                f"MySQL URL {where}: ssl-mode=PREFERRED falls back to plain text without saying so; "
                "use ssl-mode=REQUIRED, VERIFY_CA or VERIFY_IDENTITY (or DISABLED)"
            )
        else:
            try:
                mode = SslMode(mode_text.upper())
            except ValueError:
                modes = ", ".join(m.value for m in SslMode)
                raise ConfigError(f"MySQL URL {where}: ssl-mode {mode_text[:40]!r} is not one of {modes}") from None
        tls = cls(
            mode, found.get("ssl-ca"), found.get("ssl-cert"), found.get("ssl-key"), found.get("ssl-key-password-file")
        )
        if mode is SslMode.DISABLED and (tls.ca or tls.cert or tls.key):
            raise ConfigError(f"MySQL URL {where}: ssl-ca, ssl-cert and ssl-key need TLS, but ssl-mode is DISABLED")
        if mode is SslMode.REQUIRED and tls.ca:
            raise ConfigError(f"MySQL URL {where}: ssl-mode=REQUIRED does not check ssl-ca; use ssl-mode=VERIFY_CA")
        if tls.key and not tls.cert:
            raise ConfigError(f"MySQL URL {where}: ssl-key goes with ssl-cert")
        if tls.key_password_file and not tls.cert:
            raise ConfigError(f"MySQL URL {where}: ssl-key-password-file goes with ssl-cert and ssl-key")
        return tls

    def context(self) -> ssl.SSLContext | None:
        """The context both drivers take as ``ssl=``, built on the first call and shared after; None
        for plain TCP. ``ConfigError`` if a file cannot be read or the key cannot be decrypted."""
        if not self._built:
            self._built.append(self._build())
        return self._built[0]

    def _build(self) -> ssl.SSLContext | None:
        if self.mode is SslMode.DISABLED:
            return None
        asked: list[bool] = []

        def passphrase() -> bytes:
            # Called by OpenSSL for an encrypted key only; without this callback it prompts on the terminal.
            asked.append(True)
            return self._passphrase()

        try:
            context = ssl.create_default_context(cafile=self.ca)
            if self.mode is SslMode.REQUIRED:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            elif self.mode is SslMode.VERIFY_CA:
                context.check_hostname = False
            if self.cert:
                context.load_cert_chain(self.cert, keyfile=self.key, password=passphrase)
        except _NoPassphrase:
            raise ConfigError(
                "MySQL TLS: ssl-key is encrypted: give its passphrase in a file with ssl-key-password-file=PATH "
                "(or store the key unencrypted, readable by the relay alone)"
            ) from None
        except ssl.SSLError as exc:
            if asked:
                raise ConfigError(
                    "MySQL TLS: the passphrase in ssl-key-password-file does not decrypt ssl-key "
                    "(or the key is not ssl-cert's)"
                ) from None
            raise ConfigError(f"MySQL TLS: cannot load ssl-ca, ssl-cert or ssl-key: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"MySQL TLS: cannot load ssl-ca, ssl-cert or ssl-key: {exc}") from None
        return context

    def _passphrase(self) -> bytes:
        """The key's passphrase: the first line of ``key_password_file``."""
        if self.key_password_file is None:
            raise _NoPassphrase
        try:
            with open(self.key_password_file, "rb") as file:
                return file.readline().rstrip(b"\r\n")
        except OSError as exc:
            raise ConfigError(f"MySQL TLS: cannot read ssl-key-password-file: {exc.strerror or exc}") from None
