"""Replica exchange spread over processes: the group they form, and its one collective.

When ``fm.md(..., gpus=N, exchange_every=M)`` spreads a ladder's walkers over N processes
(:mod:`fastmace.spread`), each process runs its walkers and joins a ``torch.distributed``
group with the others (NCCL between GPUs, gloo between CPU processes; a rendezvous file, so
no port to choose). At each exchange every process contributes its walkers' energies to one
all-gather and gets the whole ladder's; the decisions that follow are the same on every
process (the same numbers from generators seeded alike), so nothing else is sent.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# How long a process waits for the others at the rendezvous or an exchange: their set-up can
# differ by a capture, a regrowth or a compilation; a part that failed ends the run after this.
GROUP_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class ExchangeGroup:
    """This process's place in a ladder spread over processes.

    Attributes:
        rank: this process's index among them.
        parts: each process's walkers, [start, stop) of the ladder, in rank order.
        rendezvous: a file path unique to the run, where the processes find each other.
        ladder_K: the whole ladder's temperatures (K), lowest first.
        seed: the request's seed (the exchange's generator is seeded from it, as in one process).
    """

    rank: int
    parts: tuple[tuple[int, int], ...]
    rendezvous: str
    ladder_K: tuple[float, ...]
    seed: int

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ExchangeGroup:
        return cls(
            rank=int(record["rank"]),
            parts=tuple((int(a), int(b)) for a, b in record["parts"]),
            rendezvous=str(record["rendezvous"]),
            ladder_K=tuple(float(t) for t in record["ladder_K"]),
            seed=int(record["seed"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "parts": [list(p) for p in self.parts],
                "rendezvous": self.rendezvous, "ladder_K": list(self.ladder_K),
                "seed": self.seed}  # fmt: skip

    @property
    def local(self) -> slice:
        """This process's walkers, as a slice of the ladder."""
        start, stop = self.parts[self.rank]
        return slice(start, stop)

    def join(self, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
        """Join the group (waits for every process) and return the energy gatherer."""
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                init_method=f"file://{self.rendezvous}", rank=self.rank,
                world_size=len(self.parts), timeout=GROUP_TIMEOUT,
            )  # fmt: skip
        return EnergyGather([range(a, b) for a, b in self.parts])

    @staticmethod
    def leave() -> None:
        """Leave the group (at the run's end, on every process)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class EnergyGather:
    """Every walker's energy from each process's own: one all-gather of equal-length pieces
    (each process's energies padded to the longest part), then the ladder's order."""

    def __init__(self, parts: Sequence[range]) -> None:
        self.width = max(len(part) for part in parts)
        self.lengths = [len(part) for part in parts]
        self.order = torch.tensor(
            [rank * self.width + i for rank, n in enumerate(self.lengths) for i in range(n)]
        )

    def __call__(self, energy: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        padded = torch.zeros(self.width, dtype=energy.dtype, device=energy.device)
        padded[: energy.shape[0]] = energy
        pieces = [torch.empty_like(padded) for _ in self.lengths]
        dist.all_gather(pieces, padded)
        return torch.cat(pieces).index_select(0, self.order.to(energy.device))
