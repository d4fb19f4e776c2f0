"""The examples in the documentation stay true: every Python block is valid Python whose calls
of ``fm.<name>(...)`` name public functions and arguments that exist, and every
``fastmace ...`` command line in a shell block is accepted by the command line's own parser.
test_docs_run.py then runs them all, with the demo model standing in for the models they name."""

from __future__ import annotations

import ast
import inspect
import shlex

import pytest
from helpers.docs_pages import BLOCK, PAGES, ROOT, command_lines

import fastmace
from fastmace.cli.main import build_parser
from fastmace.ensemble_catalog import setting_names

# Keyword arguments a function takes through **kwargs, by function.
THROUGH_KWARGS = {"md": set(setting_names())}


def _blocks(languages: tuple[str, ...]) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for language, body in BLOCK.findall(page.read_text(encoding="utf-8")):
            if language in languages:
                found.append((str(page.relative_to(ROOT)), body))
    return found


PYTHON = _blocks(("python",))
SHELL = _blocks(("bash", "sh", "console"))


def test_the_pages_have_examples_to_check():
    assert len(PYTHON) >= 10 and sum(len(command_lines(b)) for _, b in SHELL) >= 10


@pytest.mark.parametrize(
    ("page", "code"), PYTHON, ids=[f"{p}:{i}" for i, (p, _) in enumerate(PYTHON)]
)
def test_python_examples_call_what_exists(page, code):
    tree = ast.parse(code, filename=page)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if not (isinstance(owner, ast.Name) and owner.id == "fm"):
            continue
        name = node.func.attr
        assert hasattr(fastmace, name), f"{page}: fm.{name} does not exist"
        target = getattr(fastmace, name)
        parameters = inspect.signature(target).parameters
        accepted = set(parameters) | THROUGH_KWARGS.get(name, set())
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        for keyword in node.keywords:
            if keyword.arg is None:  # **options
                continue
            known = keyword.arg in accepted or (takes_any and name not in THROUGH_KWARGS)
            assert known, f"{page}: fm.{name}() has no argument {keyword.arg!r}"


COMMANDS = [(page, line) for page, body in SHELL for line in command_lines(body)]


@pytest.mark.parametrize(
    ("page", "line"), COMMANDS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(COMMANDS)]
)
def test_command_lines_are_accepted_by_the_parser(page, line):
    try:
        build_parser().parse_args(shlex.split(line)[1:])
    except SystemExit as stopped:
        pytest.fail(f"{page}: `{line}` is refused by the parser (exit {stopped.code})")
