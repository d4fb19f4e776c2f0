"""A real potential without a model for the integrators' tests: shifted-force Lennard-Jones on
small fcc crystals (its forces and stress are checked against finite differences in
test_integrators.py), and the loop that runs an integrator on it."""

from __future__ import annotations

import numpy as np
import torch
from ase.build import bulk

from fastmace.dynamics.integrators import ForceResult, maxwell_boltzmann_velocities
from fastmace.dynamics.state import State

# A cutoff below half the 2x2x2 cell keeps only nearest neighbours, which weakens cohesion; a
# deeper well than argon's (0.0104 eV) keeps the crystal solid to about 70 K.
LJ_EPSILON_EV = 0.06


LJ_SIGMA_A = 3.40


LJ_CUTOFF_A = 5.0


LATTICE_A = 5.45  # about 0.4 GPa at 0 K


ELEMENT = "Xe"  # heavy atoms: a vibration period of a few hundred fs


class LennardJones:
    """Shifted-force Lennard-Jones between all pairs of each system, minimum image.

    ``U(r) = u(r) - u(rc) - (r - rc) u'(rc)`` below the cutoff, zero above: energy and force
    are continuous there. Exact for cells whose perpendicular widths exceed twice the cutoff.
    The pairs of each system are enumerated once, for the system index it is built with, and
    padded to the same count per system (padding pairs join an atom to itself and are masked),
    so that the minimum image is a batched matrix product with each system's cell.
    """

    def __init__(self, system: torch.Tensor, cutoff: float = LJ_CUTOFF_A) -> None:
        self.epsilon, self.sigma, self.cutoff = LJ_EPSILON_EV, LJ_SIGMA_A, cutoff
        counts = torch.bincount(system.cpu()).tolist()
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        width = max(count * (count - 1) // 2 for count in counts)
        first = torch.zeros(len(counts), width, dtype=torch.int64)
        second = torch.zeros_like(first)
        real = torch.zeros(len(counts), width, dtype=torch.bool)
        for index, (start, count) in enumerate(zip(starts, counts, strict=True)):
            pairs = torch.triu_indices(count, count, offset=1) + start
            first[index], second[index] = start, start
            first[index, : pairs.shape[1]], second[index, : pairs.shape[1]] = pairs
            real[index, : pairs.shape[1]] = True
        self.first, self.second, self.real = (t.to(system.device) for t in (first, second, real))
        self.u_cut, self.du_cut = self._pair(torch.tensor(cutoff, dtype=torch.float64).item())

    def _pair(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain LJ energy and its derivative at distance r."""
        sr6 = (self.sigma / r) ** 6
        return 4 * self.epsilon * (sr6 * sr6 - sr6), 24 * self.epsilon * (sr6 - 2 * sr6 * sr6) / r

    def __call__(self, state: State) -> ForceResult:
        delta = state.positions[self.second] - state.positions[self.first]  # (S, pairs, 3)
        inverse = torch.linalg.inv_ex(state.cell).inverse  # no error check: no host sync
        images = torch.round(torch.bmm(delta, inverse))
        delta = delta - torch.bmm(images, state.cell)
        r = delta.norm(dim=2)
        inside = self.real & (r < self.cutoff)
        r_safe = torch.where(inside, r, torch.full_like(r, self.cutoff))
        u, du = self._pair(r_safe)
        energy = torch.where(inside, u - self.u_cut - (r_safe - self.cutoff) * self.du_cut, 0.0)
        along = (torch.where(inside, du - self.du_cut, 0.0) / r_safe)[:, :, None] * delta
        forces = torch.zeros_like(state.positions)  # along is dU/d(delta): +on first, -on second
        forces.index_add_(0, self.first.flatten(), along.reshape(-1, 3))
        forces.index_add_(0, self.second.flatten(), -along.reshape(-1, 3))
        virial = torch.einsum("spi,spj->sij", along, delta)
        a, b, c = state.cell.unbind(dim=1)
        volume = torch.linalg.cross(a, b).mul(c).sum(dim=1).abs()[:, None, None]
        return ForceResult(energy=energy.sum(dim=1), forces=forces, stress=virial / volume)


def crystal(repeat: int = 2, rattle: float = 0.0, seed: int = 0, a: float = LATTICE_A):
    """An fcc crystal of 4 repeat³ atoms in a cubic cell, optionally rattled."""
    atoms = bulk(ELEMENT, "fcc", a=a, cubic=True).repeat((repeat, repeat, repeat))
    if rattle:
        atoms.rattle(stdev=rattle, seed=seed)
    return atoms


def batch(structures, temperature_K: float | list[float] = 0.0, seed: int = 0) -> State:
    """A State of the structures, velocities drawn at ``temperature_K`` where above zero."""
    state = State.from_atoms(structures)
    if np.any(np.asarray(temperature_K) > 0):
        state = maxwell_boltzmann_velocities(state, temperature_K, seed)
    return state


def run(md, step, compute, n_steps: int, every: int = 1, observe=None):
    """Run ``n_steps`` steps; return the last MD state and ``observe(md)`` every ``every``."""
    samples = []
    for index in range(1, n_steps + 1):
        md = step(md, compute)
        if observe is not None and index % every == 0:
            samples.append(observe(md))
    return md, samples
