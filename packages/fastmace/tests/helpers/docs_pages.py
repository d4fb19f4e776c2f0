"""The documentation's pages, their fenced blocks and the ``fastmace ...`` command lines in them:
what test_docs_examples.py checks against the API and test_docs_run.py runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def command_lines(body: str) -> list[str]:
    """The ``fastmace ...`` commands of a shell block, continuations joined, each cut at a
    comment, pipe, ``&&`` or redirection."""
    lines = []
    for line in body.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ")
        if line.startswith("fastmace "):
            lines.append(re.split(r" #|\||&&|>", line)[0].strip())
    return lines
