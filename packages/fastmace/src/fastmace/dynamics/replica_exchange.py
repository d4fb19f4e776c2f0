"""Replica exchange (parallel tempering): temperature swaps between neighbouring rungs of a
ladder, decided on the device.

The batch's systems are walkers, one per rung of an ascending ladder of temperatures. An
exchange tries the pairs of neighbouring rungs (0, 1), (2, 3), ... or (1, 2), (3, 4), ...,
alternately, and swaps the temperatures of a pair's two walkers with the Metropolis
probability min(1, exp((1/kT_i - 1/kT_j) (E_i - E_j))), which leaves the joint canonical
distribution of the ladder invariant. A walker that changes rung has its velocities scaled by
sqrt(T_new / T_old), so its kinetic energy is canonical at its new temperature too.

Everything is tensor work of fixed shape with no host synchronisation, so the exchange sits
inside the captured block (the engine's block end, :meth:`ReplicaExchange.apply`): it runs at
the end of every block and takes effect only when ``every`` steps have passed since the last
one, a mask rather than a branch, so every replay does the same work. The uniform numbers
come from a generator of its own.

Spread over several processes (one GPU each, :mod:`fastmace.spread`), each process holds the
walkers ``local`` of the ladder and the whole ladder's state (rungs, statistics, generator,
seeded alike everywhere). At each block's end ``gather`` brings every walker's energy to every
process (one all-gather of M numbers, :mod:`fastmace.dynamics.exchange_group`); each process
then takes the same decisions and applies them to its own walkers. That block end runs
eagerly after the block is accepted (``in_graph`` False), so every process gathers once per
block even when one of them redid its block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch


@dataclass
class ReplicaExchange:
    """The ladder, which walker holds which rung, and the swap statistics.

    Attributes:
        ladder_kT: (M,) ascending k_B T of the rungs, in eV.
        rung: (S = M,) int64, the rung each walker (system) is at: a permutation.
        attempts: (M - 1,) int64, swaps tried between rungs t and t + 1.
        accepted: (M - 1,) int64, swaps made between rungs t and t + 1.
        parity: () int64, which pairs the next exchange tries (0: those starting at even rungs).
        generator: where the uniform numbers of the Metropolis tests come from.
        every: steps between exchanges (a block end after ``every`` steps exchanges).
        steps_since: () int64, steps since the last exchange.
        local: the walkers of the ladder this process holds (all of them unless spread).
        gather: every walker's (M,) energy from this process's (len(local),) energies, when
            spread over processes; None in one process.
    """

    ladder_kT: torch.Tensor
    rung: torch.Tensor
    attempts: torch.Tensor
    accepted: torch.Tensor
    parity: torch.Tensor
    generator: torch.Generator
    every: int = 1
    steps_since: torch.Tensor | None = None
    local: slice = field(default_factory=lambda: slice(None))
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def in_graph(self) -> bool:
        """Inside the captured block, unless it talks to other processes."""
        return self.gather is None

    @classmethod
    def start(
        cls,
        ladder_kT: torch.Tensor,
        generator: torch.Generator,
        every: int = 1,
        local: slice = slice(None),
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> ReplicaExchange:
        """Walker s at rung s; host-side checks of the ladder."""
        if ladder_kT.dim() != 1 or ladder_kT.shape[0] < 2:
            raise ValueError("replica exchange needs a ladder of at least two temperatures")
        if not bool((ladder_kT[1:] > ladder_kT[:-1]).all()) or not bool((ladder_kT > 0).all()):
            raise ValueError("the temperature ladder must be positive and strictly ascending")
        device = ladder_kT.device
        rungs = ladder_kT.shape[0]
        zeros = torch.zeros(rungs - 1, dtype=torch.int64, device=device)
        return cls(
            ladder_kT=ladder_kT,
            rung=torch.arange(rungs, device=device),
            attempts=zeros,
            accepted=zeros.clone(),
            parity=torch.zeros((), dtype=torch.int64, device=device),
            generator=generator,
            every=every,
            steps_since=torch.zeros((), dtype=torch.int64, device=device),
            local=local,
            gather=gather,
        )

    # -- the engine's block end (captured with the block) -----------------------------------

    def apply(self, md: Any, steps: int) -> Any:
        """At a block's end: exchange if ``every`` steps have passed since the last exchange
        (new rungs, each walker's thermostat target and velocities); otherwise unchanged."""
        assert self.steps_since is not None
        self.steps_since.add_(steps)
        due = self.steps_since >= self.every
        self.steps_since.copy_(torch.where(due, self.steps_since - self.every, self.steps_since))
        energy = md.energy if self.gather is None else self.gather(md.energy)
        scale = self.exchange(energy, due)[self.local]
        state = md.state
        velocities = state.velocities * scale.to(state.velocities.dtype)[state.system, None]
        kT = self.ladder_kT[self.rung[self.local]]
        return replace(md, kT=kT, state=replace(state, velocities=velocities))

    def local_rungs(self) -> list[int]:
        """The rung of each walker this process holds (host read)."""
        return self.rung[self.local].tolist()

    def tensors(self) -> list[torch.Tensor]:
        assert self.steps_since is not None
        return [self.rung, self.attempts, self.accepted, self.parity, self.steps_since]

    def generators(self) -> list[torch.Generator]:
        return [self.generator]

    def saved(self) -> dict[str, Any]:
        """Everything a restart needs to continue the exchanges exactly (host arrays)."""
        return {
            "ladder_kT": self.ladder_kT.detach().cpu().numpy(),
            "rung": self.rung.cpu().numpy(),
            "attempts": self.attempts.cpu().numpy(),
            "accepted": self.accepted.cpu().numpy(),
            "parity": int(self.parity),
            "steps_since": int(self.steps_since) if self.steps_since is not None else 0,
            "generator": bytes(self.generator.get_state().cpu().numpy()),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from ``saved`` (what ``saved()`` returned), in place."""
        if len(saved["rung"]) != self.rung.shape[0]:
            raise ValueError(
                f"the restart's ladder has {len(saved['rung'])} rungs and this run has "
                f"{self.rung.shape[0]} replicas"
            )
        for name in ("rung", "attempts", "accepted"):
            getattr(self, name).copy_(torch.as_tensor(saved[name]))
        self.parity.fill_(int(saved["parity"]))
        if self.steps_since is not None:
            self.steps_since.fill_(int(saved.get("steps_since", 0)))
        self.generator.set_state(torch.frombuffer(bytearray(saved["generator"]), dtype=torch.uint8))

    def record(self, kelvin_per_eV: float) -> dict[str, Any]:
        """What metadata.json says of the exchanges so far (host reads)."""
        attempts, accepted = self.attempts.tolist(), self.accepted.tolist()
        return {
            "every": self.every,
            "ladder_K": (self.ladder_kT * kelvin_per_eV).tolist(),
            "rung_of_walker": self.rung.tolist(),
            "attempts": attempts,
            "accepted": accepted,
            "acceptance": [made / tried if tried else None
                           for made, tried in zip(accepted, attempts, strict=True)],
        }  # fmt: skip

    def walkers(self) -> torch.Tensor:
        """(M,) the walker at each rung (the inverse of ``rung``)."""
        return _inverse(self.rung)

    def exchange(self, energy: torch.Tensor, due: torch.Tensor | None = None) -> torch.Tensor:
        """Try one round of swaps given each walker's (S,) potential energy (eV); with a
        boolean ``due`` tensor, only if it is true (the same work either way).

        Updates ``rung``, the statistics and ``parity`` in place and returns the (S,) factor
        to scale each walker's velocities by.
        """
        rungs = self.ladder_kT.shape[0]
        device = energy.device
        walker = self.walkers()
        lower = torch.arange(rungs - 1, device=device)  # pair t joins rungs t and t + 1
        tried = (lower % 2) == self.parity
        if due is not None:
            tried = tried & due
        beta = 1.0 / self.ladder_kT
        gain = (beta[:-1] - beta[1:]) * (energy[walker[:-1]] - energy[walker[1:]])
        uniform = torch.rand(rungs - 1, generator=self.generator, dtype=energy.dtype, device=device)
        swap = tried & (torch.log(uniform) < gain)  # Metropolis: min(1, exp(gain))
        # Each rung's new walker: from the rung above if it is the lower end of a swapped pair,
        # from the rung below if the upper end, else its own (tried pairs never overlap).
        from_above = torch.cat([swap, swap.new_zeros(1)])
        from_below = torch.cat([swap.new_zeros(1), swap])
        up = torch.roll(walker, -1)
        down = torch.roll(walker, 1)
        new_walker = torch.where(from_above, up, torch.where(from_below, down, walker))
        old_rung = self.rung.clone()
        new_rung = _inverse(new_walker)
        self.rung.copy_(new_rung)
        self.attempts.add_(tried.long())
        self.accepted.add_(swap.long())
        flipped = 1 - self.parity
        self.parity.copy_(flipped if due is None else torch.where(due, flipped, self.parity))
        return torch.sqrt(self.ladder_kT[new_rung] / self.ladder_kT[old_rung])


def _inverse(permutation: torch.Tensor) -> torch.Tensor:
    """The inverse of a permutation of 0..n-1 (a scatter: no host synchronisation)."""
    positions = torch.arange(permutation.shape[0], device=permutation.device)
    return torch.empty_like(permutation).scatter_(0, permutation, positions)


def geometric_ladder(low_K: float, high_K: float, rungs: int) -> list[float]:
    """``rungs`` temperatures from ``low_K`` to ``high_K`` with a constant ratio between
    neighbours: the usual first ladder for parallel tempering (equal acceptance for a system
    whose heat capacity does not change with temperature)."""
    if rungs < 2 or not 0 < low_K < high_K:
        raise ValueError(f"need 0 < low_K < high_K and rungs >= 2, got {low_K}, {high_K}, {rungs}")
    ratio = (high_K / low_K) ** (1.0 / (rungs - 1))
    return [low_K * ratio**index for index in range(rungs)]
