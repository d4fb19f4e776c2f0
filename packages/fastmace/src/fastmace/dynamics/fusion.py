"""The MD step's own arithmetic fused into few kernels, in runs that compile their model.

Around the model, every step does about a hundred tiny tensor operations of its own: the
integrator's kicks, drifts and thermostat, the Verlet skin test, the compaction of the list to
the cutoff, the guard's running maximum. Run eagerly each is one kernel launch; at 216 atoms
the step's element-wise, indexing and reduction launches were 0.37 ms of its 1.25 ms (212
launches; H100, docs/validation/performance.md). A function marked :func:`fusible` is plain
tensor code that Inductor compiles into a few kernels when the engine runs its steps inside
:func:`fusing`: it does so where the planner compiles the model on CUDA, a run that pays for
compilation anyway and whose kernels Inductor's cache keeps. Everywhere else (the CPU,
uncompiled runs, evaluations outside the engine) the functions run as written.

A fusible function that cannot be compiled (an operation Inductor does not lower, a failed
build) runs eagerly from then on, with a warning; :func:`fusion_failures` names them for the
run's record. Results are the same either way up to floating-point rounding: Inductor may
reorder a sum, never change what is computed.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import torch

Function = TypeVar("Function", bound=Callable[..., Any])

# Set only inside `fusing` (the engine's steps); a context variable, so a caller's other
# threads and evaluations outside the engine are untouched.
_FUSING: ContextVar[bool] = ContextVar("fastmace_fusing", default=False)

# Why each fusible function that failed to compile runs eagerly, by qualified name.
_FAILURES: dict[str, str] = {}


@contextlib.contextmanager
def fusing(enabled: bool = True) -> Iterator[None]:
    """Within the block, :func:`fusible` functions run compiled when ``enabled``."""
    token = _FUSING.set(enabled)
    try:
        yield
    finally:
        _FUSING.reset(token)


def fusion_failures() -> dict[str, str]:
    """The fusible functions that could not be compiled, and why (they ran eagerly)."""
    return dict(_FAILURES)


def fusible(function: Function) -> Function:
    """Mark ``function`` (tensors in, tensors out, no host reads) for fusion by Inductor.

    Called from another fusible function that is being compiled, it is traced into the
    caller's graph; inside :func:`fusing`, it runs through ``torch.compile`` (compiled at its
    first call, outside any CUDA graph capture: the engine's first block runs eagerly).
    """
    name = function.__qualname__
    compiled: Callable[..., Any] | None = None

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        if torch.compiler.is_compiling() or not _FUSING.get() or name in _FAILURES:
            return function(*args, **kwargs)
        if compiled is None:
            compiled = torch.compile(function, fullgraph=True)
        try:
            return compiled(*args, **kwargs)
        except Exception as error:  # a failure to compile: run as written
            if not _compile_error(error):
                raise
            _FAILURES[name] = f"{type(error).__name__}: {error}"[:300]
            warnings.warn(
                f"{name} could not be fused ({_FAILURES[name]}); it runs unfused",
                RuntimeWarning,
                stacklevel=2,
            )
            return function(*args, **kwargs)

    call.unfused = function  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


def _compile_error(error: Exception) -> bool:
    """Was ``error`` raised by Dynamo or Inductor (not by the function's own arithmetic)?"""
    from torch._dynamo import exc

    return isinstance(error, exc.TorchDynamoException | exc.BackendCompilerFailed)
