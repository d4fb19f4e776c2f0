"""A dispatch mode that refuses host synchronisations: what a captured CUDA graph cannot hold,
caught on the CPU."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostSync(RuntimeError):
    pass


class ForbidHostSync(TorchDispatchMode):
    """Raise on every operator that reads a value back to the host or whose output shape
    depends on the data (and so would read one back on a GPU)."""

    aten = torch.ops.aten
    FORBIDDEN = (
        aten._local_scalar_dense,  # .item(), int(t), float(t), bool(t)
        aten.is_nonzero,
        aten.equal,
        aten.nonzero,
        aten.nonzero_static,
        aten.masked_select,
        aten.bincount,
        aten.unique_consecutive,
        aten._unique2,
        aten.unique_dim,
        aten.repeat_interleave,
    )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.FORBIDDEN:
            raise HostSync(str(func))
        if func.overloadpacket in (self.aten.index, self.aten.index_put, self.aten.index_put_):
            indices = args[1]
            if any(i is not None and i.dtype == torch.bool for i in indices):
                raise HostSync(f"{func} with a boolean mask")
        return func(*args, **(kwargs or {}))
