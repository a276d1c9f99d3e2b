"""One log format for every logger (ours, uvicorn's, libraries'): JSON lines or a readable
console line, chosen by `log_format`. Every line carries the request id of the request (and
turn) that wrote it; known secrets are masked in whatever a line says."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any, Literal

from aap_server.telemetry.context import current_request_id

LogFormat = Literal["json", "console"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
# (uvicorn adds `color_message`, its message with terminal colour codes: not a field.)
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "color_message",
}
MASK = "***"
_HANDLER_NAME = "aap_server"


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in record.__dict__.items() if key not in _STANDARD}


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request's id (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id()
        return True


class SecretMask(logging.Filter):
    """Replaces known secrets (API keys, remote guardians' keys) in a line's message and
    fields: a backstop, the server's own lines never include them."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        # Longest first: a key that contains another is masked whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def _mask(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = self._mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        for key, value in _extras(record).items():
            if isinstance(value, str):
                setattr(record, key, self._mask(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = self._mask(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = self._mask(record.exc_text)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            line["request_id"] = request_id
        line.update(_extras(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    """`2026-11-23T08:40:01.123Z INFO  aap_server.access [request id] message`; the fields a
    JSON line adds are said in the message already."""

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        parts = [_timestamp(record), f"{record.levelname:<5}", record.name]
        if request_id is not None:
            parts.append(f"[{request_id}]")
        parts.append(record.getMessage())
        text = " ".join(parts)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        return text


def configure_logging(level: str, log_format: LogFormat, secrets: Iterable[str] = ()) -> None:
    """Route every logger through one handler on stderr in `log_format`. Uvicorn must be run
    with `log_config=None` so that it keeps this (its loggers propagate here)."""
    # No line says where it was logged from, or in which thread or process: no record looks
    # them up (a third of making one; the logging HOWTO's "Optimization").
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else ConsoleFormatter())
    handler.addFilter(RequestIdFilter())
    secrets = list(secrets)
    if secrets:
        handler.addFilter(SecretMask(secrets))
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):
        # Ours from an earlier call, or the default stream handler; not a handler someone
        # else attached on purpose (pytest's capture, say).
        if old.name == _HANDLER_NAME or type(old) is logging.StreamHandler:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel("DEBUG" if level.upper() == "TRACE" else level.upper())  # TRACE: uvicorn's
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # httpx logs every request at INFO: one line per remote-guardian check is noise.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
