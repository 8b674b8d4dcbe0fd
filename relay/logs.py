"""Logging set-up for the CLI: text or JSON lines, and secrets scrubbed."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from relay.secrets import Scrubber

# Attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class ScrubSecrets(logging.Filter):
    """Replaces known secrets with ``***`` in every record: its message, its
    ``extra=`` fields (the JSON keys), its traceback and its stack.

    Adapters already keep passwords out of what they log; this is the second
    line, for text that comes from libraries. What counts as a secret, and in
    which spellings, is :class:`relay.secrets.Scrubber`'s call.
    """

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.scrub = Scrubber(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops a record."""
        if not self.scrub:
            return True
        message = record.getMessage()
        scrubbed = self.scrub(message)
        if scrubbed != message or record.exc_info:
            record.msg, record.args = scrubbed, None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, self.scrub(text)
        elif record.exc_text:
            record.exc_text = self.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self.scrub(record.stack_info)
        for key, value in list(record.__dict__.items()):
            if key in _STANDARD or isinstance(value, int | float | bool | None):
                continue
            text = value if isinstance(value, str) else str(value)
            clean = self.scrub(text)
            if clean != text:
                setattr(record, key, clean)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line with the ``extra=`` context as keys."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record``."""
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "action": getattr(record, "action", None),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_text or record.exc_info:
            entry["exception"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """``time level logger: message [action=...]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` with its action, if any."""
        text = super().format(record)
        action = getattr(record, "action", None)
        return f"{text} [action={action}]" if action else text


def configure(level: str = "INFO", fmt: str = "text", secrets: list[str] | None = None) -> None:
    """Send logs to stderr in ``fmt`` at ``level``, scrubbing ``secrets``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ScrubSecrets(secrets or []))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # pika logs connection parameters at DEBUG; keep it quiet unless asked.
    # pika logs every refused connection at ERROR, repeatedly, while the sink
    # already logs one line per outage; keep it for DEBUG sessions only.
    logging.getLogger("pika").setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.CRITICAL)


def configure_from_flags(prog: str, level: str, fmt: str, secrets: list[str]) -> bool:
    """:func:`configure` from command-line flags; on a bad value print a one-line error and return False."""
    if fmt not in ("text", "json"):
        print(f"{prog}: error: --log-format must be text or json", file=sys.stderr)
        return False
    try:
        configure(level, fmt, secrets)
    except ValueError:
        print(f"{prog}: error: unknown --log-level {level!r}", file=sys.stderr)
        return False
    return True
