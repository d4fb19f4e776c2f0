"""Checks of single values of a run request: numbers, whole numbers, switches, names, paths.

Each failure is a :class:`RequestError` that names the setting, the value and what to give.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any


class RequestError(ValueError):
    """A setting of a run request that cannot be used; ``setting`` names it (or is None)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class RequestTypeError(RequestError, TypeError):
    """A setting of the wrong kind (a text where a number belongs, say)."""


def _shown(name: str, value: Any) -> str:
    return f"{name}={value!r:.80}"


def is_number(value: Any) -> bool:
    """A real number, not a bool (``True`` is an int to Python, never a temperature)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def number(name: str, value: Any, unit: str) -> float:
    """A finite real number."""
    if not is_number(value):
        raise RequestTypeError(
            f"{_shown(name, value)} is not allowed: give a number ({unit})", name
        )
    if not math.isfinite(float(value)):
        raise RequestError(
            f"{_shown(name, value)} is not allowed: give a finite number ({unit})", name
        )
    return float(value)


def per_system_numbers(name: str, value: Any, unit: str) -> list[float]:
    """One finite number for every system, or a list (array) with one per system."""
    items = value.tolist() if hasattr(value, "tolist") else value  # NumPy arrays, tensors
    if isinstance(items, str) or not isinstance(items, Sequence):
        items = [items]
    if not items or not all(is_number(item) for item in items):
        raise RequestTypeError(
            f"{_shown(name, value)} is not allowed: give a number ({unit}), or a list of "
            "numbers with one per system of the batch",
            name,
        )
    bad = [item for item in items if not math.isfinite(float(item))]
    if bad:
        raise RequestError(
            f"{_shown(name, value)} is not allowed: give finite numbers ({unit})", name
        )
    return [float(item) for item in items]


def whole(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number (an int, not a float or bool), at least ``minimum`` and at most
    ``maximum`` if given."""
    if maximum is not None and minimum is not None:
        bounds = f" from {minimum} to {maximum}"
    else:
        bounds = "" if minimum is None else f" >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RequestTypeError(
            f"{_shown(name, value)} is not allowed: give a whole number{bounds}", name
        )
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise RequestError(
            f"{_shown(name, value)} is not allowed: give a whole number{bounds}", name
        )
    return int(value)


def switch(name: str, value: Any) -> bool:
    """True or False, and nothing that merely looks like one (``"no"`` is a true string)."""
    if not isinstance(value, bool):
        raise RequestTypeError(
            f"{_shown(name, value)} is not allowed: give True or False (true or false in TOML)",
            name,
        )
    return value


def one_of(name: str, value: Any, choices: Sequence[str]) -> str:
    """One of the names ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise RequestError(
            f"{_shown(name, value)} is not allowed: choose one of {', '.join(choices)}", name
        )
    return value


def optional_text(name: str, value: Any, what: str) -> None:
    """None, or a non-empty string."""
    if value is not None and (not isinstance(value, str) or not value):
        raise RequestTypeError(f"{_shown(name, value)} is not allowed: give {what}", name)


def optional_path(name: str, value: Any, what: str) -> None:
    """None, or a path (a non-empty string or an ``os.PathLike``)."""
    if value is None:
        return
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise RequestTypeError(f"{_shown(name, value)} is not allowed: give {what} (a path)", name)
