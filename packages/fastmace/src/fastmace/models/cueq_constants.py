"""cuEquivariance's path tables as constants that torch.compile reads in one piece.

cuEquivariance-torch's ``uniform_1d`` modules (the symmetric contraction, the convolution's
tensor product) keep their polynomial as Python lists of ints and floats (``path_indices``,
``path_coefficients``, ...) that ``forward`` hands to the ``cuequivariance::uniform_1d`` op. A
Python list is mutable, so Dynamo wraps it element by element and guards every element: MP-0
medium's first symmetric contraction alone has 12,140 of them, 22,450 guards and 4.7 s of
tracing on this project's CPU machine against 153 guards and 0.7 s as tuples
(docs/validation/performance.md), paid again at every start, warm cache or not, because
Dynamo's tracing is never cached. A tuple of constants is one constant with one guard.

The op's schema takes ``int[]`` and ``float[]``: the dispatcher turns either a list or a
tuple into the same argument, so the op, its fake and its backward see lists as before and
the numbers are the same. Only the converted model's own modules are changed, and pickling
is untouched (these modules pickle as their polynomial and are rebuilt from it).
"""

from __future__ import annotations

import torch

# The attributes ``forward`` passes straight to the op, unchanged (cuequivariance-torch 0.13).
PASSED_THROUGH = (
    "buffer_dim",
    "buffer_num_segments",
    "dtypes",
    "num_operands",
    "operations",
    "num_paths",
    "path_indices_start",
    "path_coefficients_start",
    "path_indices",
    "path_coefficients",
)
MODULE_CLASS = "SegmentedPolynomialFromUniform1dJit"


def path_tables_as_constants(model: torch.nn.Module) -> int:
    """Turn the path lists of ``model``'s cuEquivariance ``uniform_1d`` modules into tuples,
    in place; return how many modules were changed (0 where none runs, as on the CPU)."""
    changed = 0
    for module in model.modules():
        if type(module).__name__ != MODULE_CLASS:
            continue
        lists = {name: getattr(module, name, None) for name in PASSED_THROUGH}
        if not all(isinstance(value, (list, tuple)) for value in lists.values()):
            continue  # another layout than the one read above: leave it as it is
        for name, value in lists.items():
            if isinstance(value, list):
                setattr(module, name, tuple(value))
        changed += 1
    return changed
