"""The matrix exponential and its Fréchet derivative, with no host synchronisation.

``torch.linalg.matrix_exp`` reads the matrices' norms on the host to choose its method, which
a CUDA graph cannot capture. These use scaling and squaring with a per-matrix number of
squarings decided on the device (a fixed number of masked squarings) and a Taylor polynomial
of fixed degree, exact to float64 rounding for the small matrices of a cell relaxation.
"""

from __future__ import annotations

import torch

# Matrices are scaled to a 1-norm of at most 1/2; the Taylor remainder after degree 14 is then
# below 0.5^15 / 15! ~ 2e-17, float64's rounding. 24 squarings cover 1-norms up to 8e6.
_SCALED_NORM = 0.5
_TAYLOR_DEGREE = 14
_MAX_SQUARINGS = 24


def matrix_exp(matrices: torch.Tensor) -> torch.Tensor:
    """``exp(A)`` of each (..., n, n) matrix, by scaling and squaring; capture-safe."""
    norm = matrices.abs().sum(dim=-2).amax(dim=-1)  # the 1-norm of each matrix
    squarings = torch.ceil(torch.log2(norm.clamp(min=1e-300) / _SCALED_NORM)).clamp(
        0, _MAX_SQUARINGS
    )
    scaled = matrices / torch.exp2(squarings)[..., None, None]
    identity = torch.eye(matrices.shape[-1], dtype=matrices.dtype, device=matrices.device)
    result = identity.expand_as(matrices)
    for k in range(_TAYLOR_DEGREE, 0, -1):  # Horner: I + A/1 (I + A/2 (I + ... A/k))
        result = identity + (scaled @ result) / k
    for k in range(_MAX_SQUARINGS):
        result = torch.where((squarings > k)[..., None, None], result @ result, result)
    return result


def matrix_exp_frechet(matrices: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """The Fréchet derivative ``L(A, E) = d/dt exp(A + t E)`` at t = 0, for each pair.

    From the block identity ``exp([[A, E], [0, A]]) = [[exp A, L(A, E)], [0, exp A]]``. The
    derivative is linear in E, so E is scaled to unit size first (the block's norm, and with
    it the accuracy, then depends on A alone) and the result scaled back.
    """
    n = matrices.shape[-1]
    size = directions.abs().sum(dim=-2).amax(dim=-1).clamp(min=1e-300)[..., None, None]
    block = torch.zeros(
        (*matrices.shape[:-2], 2 * n, 2 * n), dtype=matrices.dtype, device=matrices.device
    )
    block[..., :n, :n] = matrices
    block[..., n:, n:] = matrices
    block[..., :n, n:] = directions / size
    return matrix_exp(block)[..., :n, n:] * size
