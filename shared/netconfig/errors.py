"""Errors that name the field and the value."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

# Longest key or value an error shows; longer ones are cut.
MAX_SHOWN = 64


def key_text(key: str) -> str:
    """A JSON object key as a path segment: as it is when it reads plainly, else as an
    escaped, quoted and bounded JSON string, so a path never carries a lone surrogate
    (which no protobuf string or UTF-8 log line can hold), a control character, blank
    ends or megabytes of key."""
    # str.isprintable() is False for control characters and lone surrogates.
    if key and len(key) <= MAX_SHOWN and key.isprintable() and key == key.strip():
        return key
    return json.dumps(key[:MAX_SHOWN]) + ("..." if len(key) > MAX_SHOWN else "")


@dataclass(frozen=True)
class FieldError:
    """One problem with one field, e.g. ``interface.mtu: must be at least 68, got 50``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """A NetworkConfig that cannot be used; carries every FieldError found."""

    def __init__(self, errors: Iterable[FieldError], context: str = "") -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        self.context = context
        text = "; ".join(str(e) for e in self.errors)
        super().__init__(f"{context}: {text}" if context else text)
