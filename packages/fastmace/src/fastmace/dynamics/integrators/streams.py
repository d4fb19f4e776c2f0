"""Random streams: one generator per system, so that a system's noise does not depend on what
else is in the batch.

With an int seed, system ``s`` of a batch draws every random number (initial velocities,
Langevin noise, CSVR's and the barostat's draws) from its own generator seeded with
``seed + s``: run alone with that seed, it draws the same numbers, and follows the same
trajectory up to floating-point rounding. A sequence gives each system its seed (or
generator). A single ``torch.Generator`` serves the whole batch as one stream, as before
streams existed: then a system's noise depends on the batch.

Draws per system are separate kernel launches (one per system and draw); a batch of one is
one draw, as it always was. Nothing here synchronises with the host: safe inside a captured
step, with every generator registered with the graph (`Engine` does this).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fastmace.dynamics.state import State

Seed = int | torch.Generator | Sequence[int | torch.Generator]


@dataclass(frozen=True)
class RandomStreams:
    """The generators a batch draws from: one per system, or one shared by the batch.

    Attributes:
        generators: one per system in system order, or a single one for the whole batch.
        atoms: atoms per system (host integers); each system's atoms are contiguous.
    """

    generators: tuple[torch.Generator, ...]
    atoms: tuple[int, ...]

    @property
    def shared(self) -> bool:
        """Whether the whole batch draws from one generator."""
        return len(self.generators) == 1

    def per_atom(self, *tail: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """(N, *tail) standard normal numbers, each system's rows from its own stream."""
        return self._normal(self.atoms, tail, dtype, device)

    def per_system(self, *tail: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """(S, *tail) standard normal numbers, row ``s`` from system ``s``'s stream."""
        return self._normal((1,) * len(self.atoms), tail, dtype, device)

    def _normal(
        self, rows: tuple[int, ...], tail: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """``rows[s]`` rows of standard normal numbers per system, stacked in system order."""
        if self.shared:
            return torch.randn(
                (sum(rows), *tail), generator=self.generators[0], dtype=dtype, device=device
            )
        return torch.cat(
            [
                torch.randn((count, *tail), generator=generator, dtype=dtype, device=device)
                for generator, count in zip(self.generators, rows, strict=True)
            ]
        )

    def gamma(self, shape_parameter: torch.Tensor) -> torch.Tensor:
        """(S,) Gamma(shape, 1) draws, entry ``s`` from system ``s``'s stream."""
        if self.shared:
            return torch._standard_gamma(shape_parameter, generator=self.generators[0])
        return torch.cat(
            [
                torch._standard_gamma(shape_parameter[index : index + 1], generator=generator)
                for index, generator in enumerate(self.generators)
            ]
        )


def random_streams(rng: Seed | RandomStreams, state: State) -> RandomStreams:
    """The streams of ``state``'s batch from ``rng``: an int seed (system ``s`` seeded with
    ``seed + s``), one seed or generator per system, one generator for the whole batch, or
    streams made before (returned as they are, after a check that they fit the batch).

    Host-side: reads the batch's layout once. Generators must live on the state's device.
    """
    atoms = _atoms_per_system(state)
    if isinstance(rng, RandomStreams):
        if rng.atoms != atoms:
            raise ValueError(
                f"these random streams were made for systems of {list(rng.atoms)} atoms, "
                f"not {list(atoms)}"
            )
        return rng
    if isinstance(rng, torch.Generator):
        return RandomStreams((_on_device(rng, state.device),), atoms)
    if isinstance(rng, bool) or not isinstance(rng, int | Sequence):
        raise TypeError(
            "rng must be an int seed, a torch.Generator, or one of either per system; got "
            f"{type(rng).__name__}"
        )
    seeds = [rng + index for index in range(len(atoms))] if isinstance(rng, int) else list(rng)
    if len(seeds) != len(atoms):
        raise ValueError(f"{len(seeds)} seeds or generators for {len(atoms)} systems")
    return RandomStreams(tuple(_generator(seed, state.device) for seed in seeds), atoms)


def _generator(seed: int | torch.Generator, device: torch.device) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return _on_device(seed, device)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"a seed must be an int or a torch.Generator, got {type(seed).__name__}")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _on_device(generator: torch.Generator, device: torch.device) -> torch.Generator:
    have, want = torch.device(generator.device), torch.device(device)
    if have.type != want.type or (None not in (have.index, want.index) and have != want):
        raise ValueError(
            f"the random generator is on {generator.device} but the state is on {device}; "
            f"create it with torch.Generator(device={str(device)!r}) or pass an int seed"
        )
    return generator


def _atoms_per_system(state: State) -> tuple[int, ...]:
    """Atoms per system, checking that each system's atoms are one contiguous block."""
    system = state.system.detach().to("cpu")
    counts = torch.bincount(system, minlength=state.n_systems)
    expected = torch.repeat_interleave(torch.arange(state.n_systems), counts)
    if not torch.equal(system, expected):
        raise ValueError("each system's atoms must be one contiguous block, in system order")
    return tuple(int(c) for c in counts)
