"""Structured logging: one JSON object a line, level changeable at run time.

Context keys (pod, claim, device, ...) are passed with ``extra=`` or through
``log_fields`` and land as top-level keys of the JSON object.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

_service = "dranet"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with ts, level, service, logger, msg and
    any extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": _service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def normalize_level(level: str) -> str:
    """Upper-case level name; ValueError naming the accepted ones otherwise."""
    name = level.strip().upper()
    if name == "WARN":
        name = "WARNING"
    if name not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    return name


def setup(service: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every log line of this process to ``stream`` (stderr) as JSON."""
    global _service
    _service = service
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(normalize_level(level))
    # Library chatter stays at WARNING unless debugging was asked for explicitly.
    for noisy in (
        "asyncio",
        "aiohttp",
        "pyroute2",
        "grpc",
        "uvicorn.access",
        "uvicorn.error",
        "hpack",
        "h11",
        "celpy",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def set_level(level: str) -> str:
    """Change this process's level now; returns the normalized name."""
    name = normalize_level(level)
    logging.getLogger().setLevel(name)
    return name


def get_level() -> str:
    return logging.getLevelName(logging.getLogger().level)


def log_fields(**fields: Any) -> Mapping[str, Any]:
    """``extra=`` for a log call, dropping empty values: log.info("x", extra=log_fields(pod=...))."""
    return {k: v for k, v in fields.items() if v not in (None, "")}


class FieldsLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that adds an object's fields to every call, merged with the call's own
    ``extra=`` (which win): ``self.log = FieldsLogger(log, conn=name)``."""

    def __init__(self, logger: logging.Logger, **fields: Any) -> None:
        super().__init__(logger, dict(log_fields(**fields)))

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs
