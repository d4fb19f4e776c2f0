"""Inductor's compile workers: left out where a run's compilation comes from the cache.

At its first compilation in a process, Inductor starts a pool of worker processes (one per
core, at most 32) to compile Triton kernels in parallel, and from then on sends every kernel
through the pool, also one it only loads from its cache. A cold start needs the pool; a warm
one, where every kernel is in the cache, only pays for starting it. Measured on an H100 (MP-0
medium, 13,824 atoms, today's default path, `benchmarks/results/2026-12-07d-h100/`): warm
`fastmace md` runs reached their first step in 28.8 and 31.9 s with the pool and in 23.1-23.4 s
with one worker (``TORCHINDUCTOR_COMPILE_THREADS=1``), the first block 12.0 against 9.3 s. The
planner's ``compile_workers`` decision says when a run takes one worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def inductor_workers(count: int | None) -> Iterator[None]:
    """Inside the block Inductor compiles with ``count`` workers (1: in this process, no pool);
    None leaves Inductor's own setting. Inductor's setting is restored on leaving."""
    if count is None:
        yield
        return
    from torch._inductor import config

    with config.patch(compile_threads=count):
        yield
