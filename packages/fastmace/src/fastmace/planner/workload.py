"""``fm.Workload``: what a run asks for (systems, species, ensemble, length, precision, device).

A Workload says what is asked, never how it runs: the planner turns it into a Plan. It is plain,
validated data, built directly or from ASE structures with :meth:`Workload.from_structures`,
which reads them without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fastmace.ensemble_catalog import canonical_ensemble, descriptor, descriptors
from fastmace.vocabulary import DTYPES, MAX_TIMESTEP_FS

PRECISIONS = ("auto", "float32", "float64")
DEVICES = ("auto", "cuda", "cpu")

Periodicity = tuple[bool, bool, bool]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{field}={value!r} is not allowed: use one of {', '.join(choices)}")


def _periodicity(value: Any, n_systems: int) -> tuple[Periodicity, ...]:
    """One (x, y, z) triple per system, from a bool, one triple for all, or one per system."""
    if isinstance(value, bool):
        return ((value, value, value),) * n_systems
    items = tuple(value)
    if len(items) == 3 and all(isinstance(item, bool) for item in items):
        return (_triple(items),) * n_systems
    triples = tuple(tuple(triple) for triple in items)
    if len(triples) != n_systems or any(
        len(triple) != 3 or not all(isinstance(flag, bool) for flag in triple) for triple in triples
    ):
        raise ValueError(
            f"periodic={value!r} is not allowed: give a bool, one (x, y, z) triple of bools, or "
            f"one triple per system ({n_systems})"
        )
    return tuple(_triple(triple) for triple in triples)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What is asked: the systems, the ensemble and its conditions, length, precision, device.

    Sequences given to the constructor are stored as tuples; ``species`` is sorted and unique;
    ``periodic`` is one (x, y, z) triple per system (a bool or one triple applies to all);
    ``temperatures_K`` holds one temperature for all systems or one per system.
    """

    atoms_per_system: tuple[int, ...]
    species: tuple[int, ...]
    """Atomic numbers present in any system."""
    periodic: tuple[Periodicity, ...] | Periodicity | bool = True
    ensemble: str = "nvt"
    temperatures_K: tuple[float, ...] | float = ()
    pressure_GPa: float | None = None
    steps: int = 1000
    timestep_fs: float = 1.0
    reproducible: bool = False
    precision: str = "auto"
    """The model's dtype wanted: "float32", "float64" or "auto" (the planner's rule)."""
    device: str = "auto"
    """"cuda", "cpu" or "auto" (the GPU where there is one)."""
    model_dtype: str = "float64"
    """The checkpoint's own dtype (``LoadedModel.description.dtype``): the CPU default."""
    long_range: bool = False
    """The model has a long-range part (MACE-POLAR-1's PolarMACE): it runs eagerly, on e3nn,
    and only at a fixed cell (its stress leaves out the long-range part)."""
    tabulable_radials: bool = False
    """Every interaction block's radial MLP sees the distance alone (MP-0-like blocks) or the
    distance and the edge's two elements (MH-1, density blocks, distance transforms), so its
    weights can be read from tables (fastmace.dynamics.radial_table, pair_table); known once
    loaded."""
    radials_per_element_pair: bool = False
    """The tables are per pair of elements (fastmace.dynamics.pair_table): the radial MLPs see
    the elements too (MH-1); known once loaded."""
    compile_cost_s: float | None = None
    """Seconds the last compilation of this model at this size took on this machine (the
    cache's compile record, fastmace.runtime.compile_costs); None: never compiled here, or
    the compiled code it found is no longer in the cache."""

    def __post_init__(self) -> None:
        atoms = tuple(self.atoms_per_system)
        if not atoms or not all(_whole(n) and n >= 1 for n in atoms):
            raise ValueError(
                f"atoms_per_system={self.atoms_per_system!r} is not allowed: give one positive "
                "whole number per system"
            )
        species = tuple(sorted(set(self.species)))
        if not species or not all(_whole(z) and 1 <= z <= 118 for z in species):
            raise ValueError(
                f"species={self.species!r} is not allowed: give the atomic numbers (1 to 118) "
                "present in the systems"
            )
        periodic = _periodicity(self.periodic, len(atoms))
        ensemble = canonical_ensemble(self.ensemble)
        temperatures = _temperatures(self.temperatures_K)
        object.__setattr__(self, "atoms_per_system", atoms)
        object.__setattr__(self, "species", species)
        object.__setattr__(self, "periodic", periodic)
        object.__setattr__(self, "ensemble", ensemble)
        object.__setattr__(self, "temperatures_K", tuple(float(t) for t in temperatures))
        self._check_conditions(temperatures)
        if not _whole(self.steps) or self.steps < 0:
            raise ValueError(f"steps={self.steps!r} is not allowed: give a whole number >= 0")
        if not _number(self.timestep_fs) or not 0 < self.timestep_fs <= MAX_TIMESTEP_FS:
            raise ValueError(
                f"timestep_fs={self.timestep_fs!r} is not allowed: give a timestep in "
                f"(0, {MAX_TIMESTEP_FS:g}] fs"
            )
        for name in ("reproducible", "long_range", "tabulable_radials",
                     "radials_per_element_pair"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed: use True/False")
        cost = self.compile_cost_s
        if cost is not None and (not _number(cost) or cost < 0):
            raise ValueError(
                f"compile_cost_s={cost!r} is not allowed: give the seconds (>= 0) or None"
            )
        _choice("precision", self.precision, PRECISIONS)
        _choice("device", self.device, DEVICES)
        _choice("model_dtype", self.model_dtype, DTYPES)

    def _check_conditions(self, temperatures: tuple[Any, ...]) -> None:
        n = len(self.atoms_per_system)
        if len(temperatures) not in (0, 1, n) or not all(
            _number(t) and t > 0 for t in temperatures
        ):
            raise ValueError(
                f"temperatures_K={temperatures!r} is not allowed: give one positive temperature "
                f"(K) for all systems or one per system ({n})"
            )
        known = descriptor(self.ensemble)
        if known.thermostat and not temperatures:
            raise ValueError(f"the {self.ensemble} ensemble needs a temperature (temperatures_K)")
        if self.pressure_GPa is not None:
            if not known.barostat:
                raise ValueError(f"the {self.ensemble} ensemble takes no pressure (pressure_GPa)")
            if not _number(self.pressure_GPa):
                raise ValueError(f"pressure_GPa={self.pressure_GPa!r} is not a number")
        if known.barostat and self.long_range:
            # mace-torch's PolarMACE strains the local edges only (docs/validation/polar.md).
            raise ValueError(
                f"the {self.ensemble} ensemble moves the cell by the stress, and a long-range "
                "model's stress (MACE-POLAR-1, as mace-torch computes it) leaves out its "
                "long-range part: run it at a fixed cell ("
                f"{', '.join(d.name for d in descriptors() if not d.barostat)})"
            )
        if known.barostat and not all(all(p) for p in self.periodicity):
            raise ValueError(
                f"the {self.ensemble} ensemble needs every system periodic in x, y and z; "
                f"periodic={self.periodic!r}"
            )

    @classmethod
    def from_structures(
        cls,
        structures: Any,
        *,
        ensemble: str = "nvt",
        temperature_K: float | Sequence[float] | None = None,
        pressure_GPa: float | None = None,
        steps: int = 1000,
        timestep_fs: float = 1.0,
        reproducible: bool = False,
        precision: str = "auto",
        device: str = "auto",
        model_dtype: str = "float64",
        long_range: bool = False,
        tabulable_radials: bool = False,
        radials_per_element_pair: bool = False,
        compile_cost_s: float | None = None,
    ) -> Workload:
        """The Workload of one ``ase.Atoms`` or a sequence of them (read, not modified).

        Only ``len``, ``numbers`` and ``pbc`` are read, so neither torch nor a model is needed.
        """
        items = [structures] if hasattr(structures, "get_atomic_numbers") else list(structures)
        if not items or not all(hasattr(atoms, "get_atomic_numbers") for atoms in items):
            raise TypeError("structures must be ase.Atoms or a non-empty sequence of them")
        species: set[int] = set()
        for atoms in items:
            species.update(int(z) for z in atoms.numbers)
        return cls(
            atoms_per_system=tuple(len(atoms) for atoms in items),
            species=tuple(species),
            periodic=tuple(_triple(atoms.pbc) for atoms in items),
            ensemble=ensemble,
            temperatures_K=() if temperature_K is None else _temperatures(temperature_K),
            pressure_GPa=pressure_GPa,
            steps=steps,
            timestep_fs=timestep_fs,
            reproducible=reproducible,
            precision=precision,
            device=device,
            model_dtype=model_dtype,
            long_range=long_range,
            tabulable_radials=tabulable_radials,
            radials_per_element_pair=radials_per_element_pair,
            compile_cost_s=compile_cost_s,
        )

    @property
    def periodicity(self) -> tuple[Periodicity, ...]:
        """``periodic`` as it is stored: one (x, y, z) triple per system."""
        return self.periodic  # type: ignore[return-value]

    @property
    def n_systems(self) -> int:
        return len(self.atoms_per_system)

    @property
    def n_atoms(self) -> int:
        """Atoms of all systems together: what one step of the batch computes."""
        return sum(self.atoms_per_system)

    def summary(self) -> str:
        """One line: systems, atoms, elements, ensemble, length."""
        systems = "1 system" if self.n_systems == 1 else f"{self.n_systems} systems"
        conditions = ""
        if self.temperatures_K:
            conditions = " at " + "/".join(f"{t:g}" for t in self.temperatures_K) + " K"
        if self.pressure_GPa is not None:
            conditions += f", {self.pressure_GPa:g} GPa"
        return (
            f"{systems}, {self.n_atoms} atoms ({_elements(self.species)}), {self.ensemble}"
            f"{conditions}, {self.steps} steps of {self.timestep_fs:g} fs"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data (lists for tuples)."""
        data = asdict(self)
        data["periodic"] = [list(triple) for triple in self.periodicity]
        data["n_systems"], data["n_atoms"] = self.n_systems, self.n_atoms
        return {key: list(v) if isinstance(v, tuple) else v for key, v in data.items()}


def _temperatures(value: float | Iterable[float]) -> tuple[Any, ...]:
    return (value,) if isinstance(value, int | float) else tuple(value)


def _triple(pbc: Iterable[Any]) -> Periodicity:
    x, y, z = (bool(flag) for flag in pbc)
    return (x, y, z)


def _elements(species: tuple[int, ...]) -> str:
    try:
        from ase.data import chemical_symbols  # ase is a dependency; imported only here
    except ImportError:  # pragma: no cover - ase is always installed with fastmace
        return ", ".join(f"Z={z}" for z in species)
    return ", ".join(chemical_symbols[z] for z in species)
