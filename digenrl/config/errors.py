"""ConfigError, and the two checks every section's keys go through: each failure names its key."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration key has a value that is not allowed."""


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def one_of(value: Any, key: str, allowed: tuple) -> None:
    check(value in allowed, key, f"{value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")
