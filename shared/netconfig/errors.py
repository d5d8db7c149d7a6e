"""Errors that name the field and the value."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


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

    def with_context(self, context: str) -> ConfigError:
        """The same errors, prefixed with where they came from (claim, request, source)."""
        return ConfigError(self.errors, f"{context}: {self.context}" if self.context else context)
