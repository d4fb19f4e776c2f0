"""No import circle in FastMACE: between its modules, nor between its folders.

import-linter's contracts (pyproject.toml, run by the tests session) keep the layers in order;
this test keeps every other pair of modules from importing each other, directly or through
others, lazy imports inside functions included: a circle is where the next change gets stuck.
"""

from __future__ import annotations

import grimp
import networkx as nx


def _graph() -> nx.DiGraph:
    imports = grimp.build_graph("fastmace", cache_dir=None)
    graph = nx.DiGraph()
    for module in imports.modules:
        graph.add_node(module)
        for imported in imports.find_modules_directly_imported_by(module):
            graph.add_edge(module, imported)
    return graph


def _folder(module: str) -> str:
    """fastmace.dynamics.engine -> fastmace.dynamics; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def _circles(graph: nx.DiGraph) -> list[list[str]]:
    found = nx.strongly_connected_components(graph)
    return [sorted(group) for group in found if len(group) > 1]


def test_no_module_imports_itself_through_others():
    assert _circles(_graph()) == []


def test_no_folder_imports_itself_through_others():
    folders = nx.DiGraph()
    for source, target in _graph().edges:
        if _folder(source) != _folder(target):
            folders.add_edge(_folder(source), _folder(target))
    assert _circles(folders) == []


def test_a_circle_is_found():
    """The check itself: two modules importing each other are one circle."""
    graph = nx.DiGraph([("a", "b"), ("b", "a"), ("b", "c")])
    assert _circles(graph) == [["a", "b"]]
