"""Drop one library's line from stderr while a block runs; every other line passes through.

OpenEquivariance prints some notices with ``print(..., file=sys.stderr)`` at import instead of
warning, so no warning filter reaches them. :func:`stderr_lines_dropped` puts a line filter in
front of ``sys.stderr`` for the block only and puts the user's stream back afterwards.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class _LineFilter:
    """A text stream that forwards whole lines to ``target`` except those starting ``prefix``."""

    def __init__(self, target: TextIO, prefix: str) -> None:
        self._target = target
        self._prefix = prefix
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if not line.startswith(self._prefix):
                self._target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def close_block(self) -> None:
        """Pass on an unfinished last line (a partial line cannot be judged: it is kept)."""
        if self._partial:
            self._target.write(self._partial)
            self._partial = ""

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty...: the real stream's
        return getattr(self._target, name)


@contextlib.contextmanager
def stderr_lines_dropped(prefix: str) -> Iterator[None]:
    """Within the block, lines written to ``sys.stderr`` that start with ``prefix`` are dropped."""
    user_stream = sys.stderr
    if user_stream is None:  # no stderr at all (pythonw): nothing to filter
        yield
        return
    line_filter = _LineFilter(user_stream, prefix)
    sys.stderr = line_filter  # type: ignore[assignment]
    try:
        yield
    finally:
        line_filter.close_block()
        if sys.stderr is line_filter:  # replaced again inside the block: leave that one
            sys.stderr = user_stream
