"""Whether this ``fm.md`` call is the child of a runner or of a spread ladder, and its part.

The runner's child (:mod:`fastmace.runner_child`) and a spread ladder's children
(:mod:`fastmace.spread`) tell ``fm.md`` so through this context, not through parameters of the
public function: ``metadata.json`` records where the run ran, and a ladder's part joins its
exchange group. Set only for the duration of that one call, in the child process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChildRun:
    """This call runs in a child process; ``exchange_group`` is a spread ladder's part."""

    exchange_group: dict[str, Any] | None = None


_CURRENT: ContextVar[ChildRun | None] = ContextVar("fastmace_child_run", default=None)


def current() -> ChildRun | None:
    """The child run this call belongs to, or None in the user's own process."""
    return _CURRENT.get()


@contextlib.contextmanager
def as_child(exchange_group: dict[str, Any] | None = None) -> Iterator[None]:
    """Run the block as a child run (see the module's description)."""
    token = _CURRENT.set(ChildRun(exchange_group))
    try:
        yield
    finally:
        _CURRENT.reset(token)
