"""One compile worker on a warm start (dynamics/compile_workers.py): Inductor compiles with the
count given inside the block and its own setting comes back after it. When the planner takes
one worker: test_planner.py."""

from __future__ import annotations

import torch
from torch._inductor import config
from torch._inductor.async_compile import get_compile_threads

from fastmace.dynamics.compile_workers import inductor_workers


def _compiled_with_threads_seen(count: int | None) -> list[int]:
    """Compile a small function inside ``inductor_workers(count)`` with a backend that notes
    the compile threads Inductor would use at that moment (where it decides on its pool)."""
    seen: list[int] = []

    def backend(graph: torch.fx.GraphModule, inputs: list) -> object:
        seen.append(get_compile_threads())
        return graph.forward

    def function(x: torch.Tensor) -> torch.Tensor:
        return (2 * x).sin() + x.cos()

    torch._dynamo.reset()
    with inductor_workers(count):
        torch.compile(function, backend=backend)(torch.arange(4.0))
    return seen


def test_one_worker_inside_the_block_and_inductors_setting_after():
    before = config.compile_threads
    with config.patch(compile_threads=4):  # a pool of four by Inductor's own setting
        assert _compiled_with_threads_seen(1) == [1]
        assert config.compile_threads == 4
        assert _compiled_with_threads_seen(None) == [4]
    assert config.compile_threads == before
