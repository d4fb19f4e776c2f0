"""The engine: K MD steps per launch, captured as one CUDA graph on the GPU.

``Engine.run_block()`` advances the batch by K steps. On CUDA the first block runs eagerly (on
a side stream: it is also the warm-up), then the block is captured once as a CUDA graph whose
replay reads the MD state's tensors and writes the new values back into them: neighbour-list
check and rebuild, model, integrator and thermostat noise are all device work. The host
synchronises once per block, to read the overflow flag and the block's energies. On the CPU
the same code runs uncaptured.

Guard: with a :class:`~fastmace.dynamics.guard.Guard`, each block also evaluates physical
sanity bounds on the device (largest force every step; temperature, energy, volume and
displacement at its end) into a small tensor read with the overflow flag, in the same
synchronisation; a block out of bounds stops the run with :class:`GuardError`.

Block end: a :class:`BlockEnd` (replica exchange's swaps) is applied to the state at the end
of every block, inside the captured graph; its own tensors and random generator are put back
with the state when a block is redone.

Neighbour searches: inside a block the list is searched on one step in ``search_every`` (a
fixed pattern, so the captured work is the same every replay) and the other steps only check
the Verlet skin. If a check finds that a pair may be missing, the block is redone from its start
with searches twice as often, down to every step; a run's trajectory never uses a stale list.

Overflow: when the neighbour list found more edges (or bin entries) than it has room for, the
block is wrong. The engine puts the state back as it was at the block's start, grows the list
(``overflow.regrow``), captures again and redoes the block. A list that would outgrow
matter's density or the memory available, a block that overflows more than
``max_regrowths_per_block`` times, or a non-finite energy or force stops the run with
:class:`SimulationError` instead; the caller keeps its last good restart.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from fastmace.dynamics.dispersion import DISPERSION_SEARCH_FACTOR, DispersionTerm
from fastmace.dynamics.edges import Edges
from fastmace.dynamics.errors import SimulationError
from fastmace.dynamics.fusion import fusing
from fastmace.dynamics.guard import Guard
from fastmace.dynamics.integrators import ComputeFn, ForceResult, MDState, RandomStreams
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.overflow import overflowed, regrow
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import PotentialOutput, State

StepFn = Callable[[MDState, ComputeFn], MDState]

# A block that still overflows after this many regrowths is not converging: the list keeps
# growing because the atoms keep collapsing, and the run stops instead.
MAX_REGROWTHS_PER_BLOCK = 8
# A captured block's private memory pool against the workspace of the same block run eagerly:
# 36.2 GiB against 24.7 GiB at 157,464 atoms (1.47; memory_probe.py, 2026-12-04), more than
# 1.4 at a million atoms. Blocks are captured only when this much of the workspace fits.
CAPTURE_POOL_FACTOR = 1.6


# The neighbour search (most of the list's cost) runs on one step in this many inside a block;
# the steps between only check the skin. A block whose check failed is redone with searches
# twice as often (the engine halves it, down to every step).
DEFAULT_SEARCH_EVERY = 8

# The engine's own flags at the front of the block's one read: overflow, finite energies,
# finite positions, stale list; the guard's values follow.
FLAGS = 4


class ForceField:
    """The potential on the neighbour list: what the integrators call ``compute``.

    Each call keeps the list valid, then evaluates the model on the pairs within its cutoff
    (`NeighbourList.cutoff_edges`). ``edges`` are the list's fixed-capacity buffers. With
    ``search_every == 1`` every call runs the skin test and rebuilds on the device when needed;
    otherwise the engine says which calls search (``search_now``: the list is rebuilt) and the
    others only check the skin, marking the list `stale` if it may miss a pair. With a
    ``dispersion`` term, its energy, forces and stress are added, on a list of its own kept
    valid the same way but searched less often (``dispersion_search_now``).

    ``charge`` and ``spin`` are the systems' (S,) total charges and spin multiplicities, given
    to the potential at every call: a long-range model (MACE-POLAR-1) reads them, a local one
    does not (None: a neutral singlet).
    """

    def __init__(
        self,
        potential: Potential,
        neighbours: NeighbourList,
        edges: Edges,
        stress: bool,
        *,
        search_every: int = DEFAULT_SEARCH_EVERY,
        dispersion: DispersionTerm | None = None,
        charge: torch.Tensor | None = None,
        spin: torch.Tensor | None = None,
    ) -> None:
        if search_every < 1:
            raise ValueError(f"search_every must be at least 1, got {search_every}")
        self.dispersion = dispersion  # D3(BJ) and its own list, or None
        self.charge, self.spin = charge, spin
        self.potential = potential
        self.neighbours = neighbours
        self.edges = edges
        self.stress = stress
        self.search_every = search_every
        self.search_now = True
        self.dispersion_search_now = True

    def __call__(self, state: State) -> ForceResult:
        self.edges = self._kept_valid(self.neighbours, self.edges, state)
        out = self._potential(state, self.stress)
        energy, forces, stress = out.energy, out.forces, out.stress if self.stress else None
        term = self.dispersion
        if term is not None:  # an extra energy term on its own, longer list
            term.edges = self._kept_valid(
                term.neighbours, term.edges, state, self.dispersion_search_now
            )
            extra = term.d3(state, term.edges, compute_stress=self.stress)
            energy, forces = energy + extra.energy, forces + extra.forces
            stress = None if stress is None else stress + extra.stress
        return ForceResult(energy, forces, stress)

    def _kept_valid(
        self, neighbours: NeighbourList, edges: Edges, state: State, search: bool | None = None
    ) -> Edges:
        """``edges`` brought up to date as the search pattern says (device work only):
        searched when ``search`` (default: ``search_now``), else the skin checked."""
        if self.search_every == 1:
            return neighbours.update(state, edges)
        if self.search_now if search is None else search:
            return neighbours.rebuild(state, edges)
        neighbours.check(state)
        return edges

    def model_edges(self, state: State) -> Edges:
        """The current list's pairs within the cutoff: the model's input, of fixed capacity."""
        return self.neighbours.cutoff_edges(state, self.edges)

    def stress_at(self, state: State) -> torch.Tensor:
        """(S, 3, 3) stress of every term on the current lists; for output, outside the step.

        When the steps compute no stress, the model runs uncompiled here: through a compiled
        model the strain would compile a second graph for output alone (11.5 s of Dynamo's
        tracing in a warm start on the H200 at 13,824 atoms, docs/validation/performance.md).
        """
        stress = self._potential(state, True, eagerly=not self.stress).stress
        if self.dispersion is not None:
            stress = stress + self.dispersion.d3(state, self.dispersion.edges, True).stress
        return stress

    def _potential(self, state: State, stress: bool, eagerly: bool = False) -> PotentialOutput:
        """The model on the current list's pairs within its cutoff, for the systems' charges
        (``eagerly``: without any compilation)."""
        evaluate = self.potential.evaluate_eagerly if eagerly else self.potential
        return evaluate(
            state, self.model_edges(state), compute_stress=stress, charge=self.charge,
            spin=self.spin,
        )  # fmt: skip

    def lists(self) -> list[tuple[NeighbourList, Edges]]:
        """Every neighbour list with its edges: the model's first, then the dispersion's."""
        found = [(self.neighbours, self.edges)]
        if self.dispersion is not None:
            found.append((self.dispersion.neighbours, self.dispersion.edges))
        return found

    def overflow(self) -> torch.Tensor:
        """() bool device tensor: did any list overflow?"""
        return torch.stack([edges.overflow for _, edges in self.lists()]).any()

    def stale(self) -> torch.Tensor:
        """() bool device tensor: may any list miss a pair (its skin check failed)?"""
        return torch.stack([neighbours.stale for neighbours, _ in self.lists()]).any()

    def build(self, state: State) -> None:
        """Search every list from scratch and clear its stale flag (between blocks)."""
        self.edges = self.neighbours.build(state)
        self.neighbours.stale.zero_()
        if self.dispersion is not None:
            self.dispersion.edges = self.dispersion.neighbours.build(state)
            self.dispersion.neighbours.stale.zero_()


@dataclass
class BlockReport:
    """What the host learns once per block."""

    step: int
    rebuilt_capacity: bool
    """True when this block overflowed and was redone with a larger neighbour list."""
    searched_more_often: bool = False
    """True when this block's skin check failed and it was redone with more searches."""


class BlockEnd(Protocol):
    """Device work at the end of every block, captured with it (no host synchronisation).

    One whose ``in_graph`` is False runs eagerly instead, once the block has been accepted
    (after any redo): work that talks to other processes must run exactly once per block on
    every process, whatever redo one of them needed.
    """

    in_graph: bool

    def apply(self, md: MDState, steps: int) -> MDState:
        """The state after ``steps`` more steps, changed as the work requires."""
        ...

    def tensors(self) -> list[torch.Tensor]:
        """Its own state, put back with the MD state when a block is redone."""
        ...

    def generators(self) -> list[torch.Generator]:
        """The random generators it draws from (registered with the graph, put back too)."""
        ...


def tensors_of(md: MDState) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of an integrator state (its State's and its own), by dotted name."""
    for item in dataclasses.fields(md):
        value = getattr(md, item.name)
        if isinstance(value, State):
            for sub in dataclasses.fields(value):
                yield f"state.{sub.name}", getattr(value, sub.name)
        elif isinstance(value, torch.Tensor):
            yield item.name, value


def generators_of(md: MDState) -> list[torch.Generator]:
    """Every random generator an integrator state draws from, in a fixed order."""
    found = []
    for item in dataclasses.fields(md):
        value = getattr(md, item.name)
        if isinstance(value, torch.Generator):
            found.append(value)
        elif isinstance(value, RandomStreams):
            found.extend(value.generators)
    return found


def copy_into(target: MDState, source: MDState) -> None:
    """Copy every tensor of ``source`` into the same tensor of ``target`` (same shapes)."""
    sources = dict(tensors_of(source))
    for name, tensor in tensors_of(target):
        tensor.copy_(sources[name])


def own_tensors(md: MDState) -> MDState:
    """A copy of ``md`` whose tensors are fresh (the graph's static inputs and outputs)."""
    state = replace(md.state, **{f.name: getattr(md.state, f.name).clone()
                                 for f in dataclasses.fields(md.state)})  # fmt: skip
    own = {
        item.name: getattr(md, item.name).clone()
        for item in dataclasses.fields(md)
        if isinstance(getattr(md, item.name), torch.Tensor)
    }
    return replace(md, state=state, **own)


class Engine:
    """Runs an integrator on a force field in blocks of ``block_steps`` steps."""

    def __init__(
        self,
        md: MDState,
        step: StepFn,
        force_field: ForceField,
        *,
        block_steps: int,
        capture: bool | None = None,
        guard: Guard | None = None,
        block_end: BlockEnd | None = None,
        fuse: bool = False,
    ) -> None:
        if block_steps < 1:
            raise ValueError(f"block_steps must be at least 1, got {block_steps}")
        self.md = own_tensors(md)
        self.step_fn = step
        self.force_field = force_field
        self.guard = guard  # None: only non-finite values stop the run
        self.block_end = block_end
        self.block_steps = block_steps
        # The step's own arithmetic (integrator, skin test, compaction, guard) compiled by
        # Inductor into few kernels (dynamics/fusion.py): for runs that compile their model.
        self.fuse = fuse
        cuda = self.md.state.device.type == "cuda"
        self.capture = cuda if capture is None else capture
        if self.capture and not cuda:
            raise ValueError("CUDA graph capture needs the state on a CUDA device")
        # One graph per block pattern: with and without the long list's search at its start.
        self.graphs: dict[bool, torch.cuda.CUDAGraph] = {}
        self.warmed_up = False  # a graph is captured after one eager block (the warm-up)
        self.last_launch = ""  # "eager", "capture" or "replay": what the last block did
        self.capture_failure: str | None = None  # why graphs were given up, if they were
        self.steps_done = 0  # the run's step: a resumed run's caller sets its restart's step
        self.regrowths = 0
        # None: the physical bound of fastmace.dynamics.overflow (max_edges_per_atom).
        self.max_edges_per_atom: float | None = None
        self.max_regrowths_per_block = MAX_REGROWTHS_PER_BLOCK
        self.search_halvings = 0  # blocks redone with more frequent neighbour searches
        self._side_stream: torch.cuda.Stream | None = None  # where eager blocks run on CUDA

    # -- one block -------------------------------------------------------------------------

    def _long_search_due(self) -> bool:
        """Does the next block search the dispersion term's long list at its first step?
        The list is searched every ``search_every x DISPERSION_SEARCH_FACTOR`` steps: within
        the block where that period fits in it, else at the start of every m-th block (m
        blocks span the period), so a short block does not search the long list each time."""
        if self.force_field.dispersion is None:
            return True  # no long list: one pattern
        period = self.force_field.search_every * DISPERSION_SEARCH_FACTOR
        blocks = -(-period // self.block_steps)  # ceil
        return (self.steps_done // self.block_steps) % blocks == 0

    def _advance(self, md: MDState, steps: int | None = None, long_search: bool = True) -> MDState:
        with fusing(self.fuse):
            return self._block(md, self.block_steps if steps is None else steps, long_search)

    def _block(self, md: MDState, steps: int, long_search: bool) -> MDState:
        force_field, guard = self.force_field, self.guard
        if guard is not None:
            guard.start_block(md, force_field.neighbours)
        for index in range(steps):
            # A fixed pattern within the block, so a captured block replays the same work.
            every = force_field.search_every
            force_field.search_now = index % every == 0
            period = every * DISPERSION_SEARCH_FACTOR
            force_field.dispersion_search_now = index % period == 0 and (index > 0 or long_search)
            md = self.step_fn(md, force_field)
            if guard is not None:
                guard.observe(md)
        force_field.search_now = force_field.dispersion_search_now = True
        if self.block_end is not None and self.block_end.in_graph:
            md = self.block_end.apply(md, steps)
        if guard is not None:
            guard.finish_block(md, force_field.neighbours)
        return md

    def _run_eager(self, steps: int | None = None, long_search: bool = True) -> None:
        if self.md.state.device.type == "cuda":
            # One side stream for the run: cuBLAS keeps a workspace (64 MiB on an H200) for
            # every stream it has seen, so a new stream per block grew memory by that much
            # per block until the pool's 32 streams were used (stage 57).
            if self._side_stream is None:
                self._side_stream = torch.cuda.Stream(self.md.state.device)
            side = self._side_stream
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                copy_into(self.md, self._advance(self.md, steps, long_search))
            torch.cuda.current_stream().wait_stream(side)
        else:
            copy_into(self.md, self._advance(self.md, steps, long_search))

    def _capture(self, long_search: bool) -> None:
        # The eager warm-up's memory, cached by the allocator, is of no use to the graph's
        # private pool: handed back first, a run does not hold one evaluation's memory twice.
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        for generator in self._generators():
            graph.register_generator_state(generator)
        # The patterns' graphs replay one after another: they can share one memory pool.
        shared = next(iter(self.graphs.values())).pool() if self.graphs else None
        with torch.cuda.graph(graph, pool=shared):
            copy_into(self.md, self._advance(self.md, long_search=long_search))
        self.graphs[long_search] = graph

    def _capture_or_give_up(self, long_search: bool) -> bool:
        """Capture the block's graph; if it would not fit in memory, or capturing fails (out
        of memory in the graph's pool, an operation that cannot be captured), give graphs up
        for the run, say why (report, metadata.json) and hand the failed capture's memory
        back. False when given up."""
        if not self.graphs:
            self.capture_failure = capture_would_not_fit(self.md.state.device)
            if self.capture_failure is not None:
                self.capture = False
                return False
        try:
            self._capture(long_search)  # capturing records the work without running it
            return True
        except RuntimeError as error:
            self.capture_failure = f"capture failed: {type(error).__name__}: {error}"[:500]
        # Outside the except clause: the traceback, and with it the failed capture's frames and
        # the graph's private pool they hold, are gone. Returned to the device, that memory is
        # there for the eager blocks (a million atoms: 131 GiB of pool, stage 56).
        self.capture = False
        self.graphs.clear()
        gc.collect()
        torch.cuda.empty_cache()
        return False

    def _launch(self, steps: int) -> None:
        long_search = self._long_search_due()
        if steps != self.block_steps:
            self._run_eager(steps, long_search)  # a short last block: not worth a capture
            self.last_launch = "eager"
        elif self.capture and self.warmed_up:
            self.last_launch = "replay"
            if long_search not in self.graphs:
                if not self._capture_or_give_up(long_search):
                    self._run_eager(long_search=long_search)
                    self.last_launch = "eager"
                    return
                self.last_launch = "capture"
            self.graphs[long_search].replay()
        else:
            self._run_eager(long_search=long_search)
            self.warmed_up = self.capture
            self.last_launch = "eager"

    def run_block(self, steps: int | None = None) -> BlockReport:
        """Advance K steps (or ``steps``, uncaptured, for a short last block); redo them with a
        larger neighbour list if the list overflowed, or with more searches if it went stale.

        Raises SimulationError when the block blew up (non-finite values) and GuardError when
        it left the guard's bounds; the state is then the block's end, not to be saved.
        """
        steps = self.block_steps if steps is None else steps
        start = own_tensors(self.md)
        block_end_start = [t.clone() for t in self.block_end.tensors()] if self.block_end else []
        generator_states = [g.get_state() for g in self._generators()]
        regrown = searched_more = False
        regrowths = 0
        while True:
            self._launch(steps)
            own = [
                self.force_field.overflow().to(torch.float64),
                torch.isfinite(self.md.energy).all().to(torch.float64),
                torch.isfinite(self.md.state.positions).all().to(torch.float64),
                self.force_field.stale().to(torch.float64),
            ]
            # The block's one host synchronisation: the engine's flags and the guard's values.
            flags = torch.cat([torch.stack(own), self._guard_values()]).cpu()
            overflow, stale = bool(flags[0]), bool(flags[3])
            if not (overflow or stale):
                break
            self._put_back(start, block_end_start, generator_states)
            if stale:
                self._search_more_often()
                searched_more = True
            if overflow:
                if regrowths == self.max_regrowths_per_block:
                    raise SimulationError(
                        f"the neighbour list overflowed {regrowths + 1} times in one block of "
                        f"{steps} steps (capacity now {self.force_field.neighbours.capacity} "
                        "edges): the atoms keep collapsing onto each other; lower the pressure "
                        "or the timestep, or check the structure and the model"
                    )
                self._regrow()
                regrown = True
                regrowths += 1
            else:
                self.force_field.build(self.md.state)
                self.graphs.clear()  # the schedule changed: capture again
        first, last = self.steps_done, self.steps_done + steps
        if not (bool(flags[1]) and bool(flags[2])):
            raise SimulationError(
                "the simulation blew up: a non-finite energy or position appeared in steps "
                f"{first} to {last}; try a smaller timestep, check the structure for "
                "atoms that are too close, or check that the model covers these elements"
            )
        if self.guard is not None:
            self.guard.check(flags[FLAGS:], steps=(first, last))  # raises GuardError
        if self.block_end is not None and not self.block_end.in_graph:
            copy_into(self.md, self.block_end.apply(self.md, steps))
        self.steps_done += steps
        return BlockReport(self.steps_done, regrown, searched_more)

    def _guard_values(self) -> torch.Tensor:
        """The guard's values of the last block, flattened (none without a guard)."""
        if self.guard is None:
            return torch.zeros(0, dtype=torch.float64, device=self.md.state.device)
        return self.guard.values.flatten()

    def _generators(self) -> list[torch.Generator]:
        """The integrator's random generators, then the block end's."""
        extra = self.block_end.generators() if self.block_end is not None else []
        return generators_of(self.md) + extra

    def _put_back(
        self,
        start: MDState,
        block_end_start: list[torch.Tensor],
        generator_states: list[torch.Tensor],
    ) -> None:
        """The state, the block end's tensors and the random generators as they were at the
        start of the block."""
        copy_into(self.md, start)
        if self.block_end is not None:
            for tensor, saved in zip(self.block_end.tensors(), block_end_start, strict=True):
                tensor.copy_(saved)
        for generator, state in zip(self._generators(), generator_states, strict=True):
            generator.set_state(state)

    def _search_more_often(self) -> None:
        self.force_field.search_every = max(1, self.force_field.search_every // 2)
        self.search_halvings += 1

    def _regrow(self) -> None:
        field, term, state = self.force_field, self.force_field.dispersion, self.md.state
        # The list that overflowed grows (host reads, between blocks); the model's if unsure.
        # A list that did not is built again from the state put back, as a grown one is.
        dispersion_full = term is not None and overflowed(term.edges)
        if dispersion_full:
            term.neighbours, term.edges = regrow(term.neighbours, state)
        elif term is not None:
            term.edges = term.neighbours.build(state)
        if term is not None:  # the three-body term's slots follow the list's longest run
            term.size_triples()
        if overflowed(field.edges) or not dispersion_full:
            field.neighbours, field.edges = regrow(
                field.neighbours, state, max_edges_per_atom=self.max_edges_per_atom
            )
        else:
            field.edges = field.neighbours.build(state)
        self.graphs.clear()  # shapes changed: capture again, after an eager warm-up block
        self.warmed_up = False
        self.regrowths += 1


def capture_would_not_fit(device: torch.device) -> str | None:
    """Why the next block should run without a graph, or None when its graph fits.

    The block's eager workspace is bounded by the process's peak allocation less what is
    allocated now (the eager warm-up block and the first forces reached that peak); its graph
    needs :data:`CAPTURE_POOL_FACTOR` times that in a pool of its own. Graphs save launch
    time, which matters for small cells; a cell whose graph does not fit is large enough that
    running its blocks eagerly costs little (a step takes a second at a million atoms).
    """
    torch.cuda.empty_cache()  # what the eager blocks cached goes back to the device first
    workspace = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    free, _ = torch.cuda.mem_get_info(device)
    needed = CAPTURE_POOL_FACTOR * workspace
    if needed <= free:
        return None
    gib = 2**30
    return (
        f"not captured: a block's graph would need about {needed / gib:.1f} GiB "
        f"({CAPTURE_POOL_FACTOR} x the {workspace / gib:.1f} GiB an eager block used) and "
        f"{free / gib:.1f} GiB are free; blocks run without CUDA graphs"
    )
