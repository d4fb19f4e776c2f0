"""How far one result is from another."""

from __future__ import annotations

import numpy as np
import torch


def relative_error(got: torch.Tensor | np.ndarray, want: np.ndarray) -> float:
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else got
    return float(np.abs(got - want).max() / np.abs(want).max())
