"""Checks of a user's structures before anything runs: each failure says what and what to do."""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

import ase
import ase.units
import numpy as np
from ase.data import chemical_symbols
from ase.neighborlist import neighbor_list

MIN_DISTANCE_A = 0.5  # closer than this, no interatomic potential is meaningful
# Hotter than this, a structure's velocities are a mistake (units, a corrupt file), not physics:
# about 100 times the temperature at which any solid or liquid has long become a plasma.
MAX_INITIAL_TEMPERATURE_K = 1e6


class StructureError(ValueError):
    """A structure FastMACE cannot simulate as given."""


def check_structures(
    structures: Sequence[ase.Atoms],
    model_species: Iterable[int] | None,
    min_distance_A: float = MIN_DISTANCE_A,
) -> None:
    """Raise StructureError for the first problem found in any of ``structures``.

    ``model_species`` None skips the one check that needs the model (its elements): fm.md
    checks the rest before loading it.
    """
    if not structures:
        raise StructureError("no structure given")
    known = None if model_species is None else set(int(z) for z in model_species)
    for index, atoms in enumerate(structures):
        where = f"structure {index}" if len(structures) > 1 else "the structure"
        _check_one(atoms, where, known, min_distance_A)


def _check_one(atoms: ase.Atoms, where: str, known: set[int] | None, min_distance: float) -> None:
    if len(atoms) == 0:
        raise StructureError(f"{where} has no atoms")
    positions = atoms.get_positions()
    if not np.isfinite(positions).all():
        bad = np.flatnonzero(~np.isfinite(positions).all(axis=1))
        raise StructureError(f"{where} has non-finite positions (atoms {bad[:10].tolist()})")
    _check_masses(atoms, where)
    _check_velocities(atoms, where)
    unknown = [] if known is None else sorted(set(atoms.get_atomic_numbers().tolist()) - known)
    if unknown:
        names = ", ".join(chemical_symbols[z] for z in unknown)
        model = ", ".join(chemical_symbols[z] for z in sorted(known or ()))
        raise StructureError(
            f"{where} contains {names}, which the model does not cover; its elements are: "
            f"{model}. Choose a model trained on these elements"
        )
    cell = np.asarray(atoms.get_cell())
    pbc = atoms.get_pbc()
    lengths = np.linalg.norm(cell, axis=1)
    if np.any(pbc & (lengths < 1e-6)):
        axes = "".join("abc"[i] for i in range(3) if pbc[i] and lengths[i] < 1e-6)
        raise StructureError(
            f"{where} is periodic along {axes} but its cell vector there is zero: set the cell "
            "(atoms.cell) or make that direction non-periodic (atoms.pbc)"
        )
    if pbc.all() and abs(np.linalg.det(cell)) < 1e-6:
        raise StructureError(
            f"{where} has a periodic cell of zero volume (cell vectors {cell.tolist()}); the cell "
            "vectors must be linearly independent"
        )
    geometry = _geometry_digest(atoms, min_distance)
    if geometry in _SPACED_APART:  # this geometry passed a moment ago (fm.md, then its run)
        _SPACED_APART.move_to_end(geometry)
        return
    first, second, distance = _close_pairs(atoms, min_distance)
    if not len(distance):
        _SPACED_APART[geometry] = None
        while len(_SPACED_APART) > REMEMBERED_GEOMETRIES:
            _SPACED_APART.popitem(last=False)
        return
    closest = int(np.argmin(distance))
    raise StructureError(
        f"{where} has atoms {int(first[closest])} and {int(second[closest])} only "
        f"{distance[closest]:.3f} Å apart (less than {min_distance} Å): overlapping atoms; "
        "check the structure file, its units (Å) and its cell"
    )


# The close-pair search is the one check whose cost grows with the atoms (about 1 s for a
# million atoms on 2 cores, more where ASE's list is used), and fm.md's preflight and then its
# Simulation both ask it of the same structures. The digests of the last few geometries found
# apart are remembered, so the second asking is free; a changed position, cell or periodicity
# is a new digest.
REMEMBERED_GEOMETRIES = 16
_SPACED_APART: OrderedDict[bytes, None] = OrderedDict()


def _geometry_digest(atoms: ase.Atoms, min_distance: float) -> bytes:
    digest = hashlib.sha256(repr(float(min_distance)).encode())
    for array in (atoms.get_positions(), np.asarray(atoms.get_cell()), atoms.get_pbc()):
        contiguous = np.ascontiguousarray(array)
        digest.update(repr((contiguous.dtype.str, contiguous.shape)).encode())
        digest.update(contiguous.tobytes())
    return digest.digest()


# ASE's neighbour list costs about 40 s for a million atoms on 2 cores, and it bins the whole
# cell (bins at least 3 Å wide): a mostly empty cell of 1e6 Å asks it for 1e16 bins. Fully
# periodic cells at least twice the cutoff high are searched by the cell list below instead.
# It keys only the occupied bins (sorted flat ids, not an array over the cell), so a mostly
# empty cell costs what its atoms cost, and the pairwise search that cells of many bins per
# atom once had is no longer needed. Candidate pairs are measured in pieces of this size.
PAIRS_PER_PIECE = 4_000_000
# Bins per axis, at most: the flat ids of three axes then fit an int64 (2**60).
MOST_BINS_PER_AXIS = 1 << 20


def _close_pairs(atoms: ase.Atoms, cutoff: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of atoms closer than ``cutoff`` (indices, both orders, and distances), as ASE's
    ``neighbor_list("ijd", ...)``, in memory that grows with the atoms whatever the cell."""
    if not atoms.get_pbc().all():
        return neighbor_list("ijd", atoms, cutoff)
    cell = np.asarray(atoms.get_cell(), dtype=float)
    heights = _cell_heights(cell)
    # Below twice the cutoff a pair can be close through several images; ASE's list finds them.
    # (NaN heights of a degenerate cell also fail the comparison and go to ASE.)
    if not (cutoff > 0 and np.all(heights >= 2 * cutoff)):
        return neighbor_list("ijd", atoms, cutoff)
    return _binned_close_pairs(atoms.get_positions(), cell, heights, cutoff)


def _cell_heights(cell: np.ndarray) -> np.ndarray:
    """The distance between each pair of opposite faces: volume / face area."""
    volume = abs(np.linalg.det(cell))
    faces = np.linalg.norm(np.cross(np.roll(cell, -1, axis=0), np.roll(cell, -2, axis=0)), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return volume / faces


def _binned_close_pairs(
    positions: np.ndarray, cell: np.ndarray, heights: np.ndarray, cutoff: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A cell list in fractional coordinates, for a periodic cell every height of which is at
    least twice ``cutoff``: each atom is compared with the atoms of its bin and of the bins
    next to it, found by searching the sorted flat ids of the occupied bins."""
    if len(positions) < 2:
        return _no_pairs()
    fractional = positions @ np.linalg.inv(cell)
    fractional -= np.floor(fractional)
    bins = _bins_per_axis(heights, cutoff)
    # A rounded 1.0 (from a coordinate a hair below 0) belongs to the last bin.
    index = np.minimum((fractional * bins).astype(np.int64), bins - 1)
    order = np.argsort(_flat_ids(index, bins), kind="stable")
    fractional = fractional[order]
    found = [_no_pairs()]
    for atom, starts, lengths in _neighbouring_ranges(index[order], bins):
        for piece in _pieces(lengths, PAIRS_PER_PIECE):
            row, other = _expand(starts[piece], lengths[piece])
            found.append(_within(fractional, cell, atom[piece][row], other, cutoff))
    first, second, distance = (np.concatenate(parts) for parts in zip(*found, strict=True))
    first, second = order[first], order[second]
    ranked = np.lexsort((second, first))  # by first atom, as ASE's list
    return first[ranked], second[ranked], distance[ranked]


def _neighbouring_ranges(
    index: np.ndarray, bins: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For each offset to a neighbouring bin, of atoms sorted by bin (``index``): every atom
    whose neighbouring bin there holds atoms, and those atoms as ranges (start, length) of the
    sorted atoms. Only occupied bins are kept, so a mostly empty cell costs nothing more."""
    keys = _flat_ids(index, bins)
    first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    counts = np.diff(np.append(first, len(keys)))
    occupied, occupied_keys = index[first], keys[first]
    # Each axis's part of the neighbours' flat ids, per step: three wraps (%) per axis, not 27.
    strides = (bins[1] * bins[2], bins[2], 1)
    parts = [
        [(occupied[:, axis] + step) % bins[axis] * strides[axis] for step in steps]
        for axis, steps in enumerate(_axis_steps(bins))
    ]
    for part_a, part_b, part_c in itertools.product(*parts):
        neighbour = part_a + part_b + part_c
        # The queries are nearly sorted (sorted bins, one offset), which searchsorted is fast at.
        at = np.minimum(np.searchsorted(occupied_keys, neighbour), len(first) - 1)
        near = np.flatnonzero(occupied_keys[at] == neighbour)
        owner, atom = _expand(first[near], counts[near])
        yield atom, first[at[near]][owner], counts[at[near]][owner]


def _bins_per_axis(heights: np.ndarray, cutoff: float) -> np.ndarray:
    """Bins at least ``cutoff`` high along each axis, so a close pair is in the same bin or in
    neighbouring ones. The margin keeps rounding from making them a hair narrower."""
    bins = np.floor(heights / (cutoff * (1 + 1e-9)))
    return np.clip(bins, 1, MOST_BINS_PER_AXIS).astype(np.int64)


def _flat_ids(index: np.ndarray, bins: np.ndarray) -> np.ndarray:
    return (index[:, 0] * bins[1] + index[:, 1]) * bins[2] + index[:, 2]


def _axis_steps(bins: np.ndarray) -> list[np.ndarray]:
    """The steps to a bin's neighbours along each axis, itself included, each bin once: along
    an axis of two bins -1 and +1 are the same bin, and of one bin all three are the bin."""
    return [np.unique(np.array([-1, 0, 1]) % count) for count in bins]


def _expand(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ranges [start, start + length) laid end to end, with the row each value came from."""
    row = np.repeat(np.arange(len(starts)), lengths)
    ends = np.cumsum(lengths)
    values = np.arange(ends[-1] if len(ends) else 0) + np.repeat(starts - ends + lengths, lengths)
    return row, values


def _pieces(lengths: np.ndarray, size: int) -> list[slice]:
    """Consecutive rows whose lengths add up to at most ``size`` (or one longer row)."""
    ends = np.cumsum(lengths)
    pieces = []
    start, done = 0, 0
    while start < len(lengths):
        stop = max(start + 1, int(np.searchsorted(ends, done + size, side="right")))
        pieces.append(slice(start, stop))
        start, done = stop, int(ends[stop - 1])
    return pieces


def _within(
    fractional: np.ndarray, cell: np.ndarray, first: np.ndarray, second: np.ndarray, cutoff: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate pairs closer than ``cutoff``, an atom never with itself. Every height is at
    least twice the cutoff, so a close pair's fractional differences are below 1/2 and the
    rounded (minimum) image is its only close one."""
    delta = fractional[second] - fractional[first]
    delta -= np.round(delta)
    vector = delta @ cell
    squared = np.einsum("ij,ij->i", vector, vector)
    keep = np.flatnonzero((squared < cutoff * cutoff) & (first != second))
    return first[keep], second[keep], np.sqrt(squared[keep])


def _no_pairs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, float)


def _check_masses(atoms: ase.Atoms, where: str) -> None:
    """Refuse zero, negative and non-finite masses (set by hand, or read from a file)."""
    masses = atoms.get_masses()
    bad = np.flatnonzero(~(np.isfinite(masses) & (masses > 0)))
    if len(bad):
        shown = ", ".join(f"atom {i}: {masses[i]:g}" for i in bad[:5])
        raise StructureError(
            f"{where} has masses that are not positive and finite ({shown}); set them "
            "(atoms.set_masses()) or leave ASE's defaults for the elements"
        )


def _check_velocities(atoms: ase.Atoms, where: str) -> None:
    """Refuse non-finite velocities, and velocities hotter than MAX_INITIAL_TEMPERATURE_K."""
    if not atoms.has("momenta"):
        return
    momenta = atoms.get_momenta()
    finite = np.isfinite(momenta).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        values = momenta[bad[:3]].tolist()
        raise StructureError(
            f"{where} has non-finite velocities (atoms {bad[:10].tolist()}, momenta "
            f"{values}); set finite velocities, or remove them (atoms.set_momenta(None)) and "
            "draw them with initial_temperature_K"
        )
    masses = atoms.get_masses()
    with np.errstate(over="ignore", invalid="ignore"):
        kinetic_eV = 0.5 * float(np.sum(momenta**2 / masses[:, None]))
        temperature_K = 2.0 * kinetic_eV / (3.0 * len(atoms) * ase.units.kB)
    if not np.isfinite(temperature_K) or temperature_K > MAX_INITIAL_TEMPERATURE_K:
        largest = np.abs(momenta / masses[:, None]).max(axis=1) * ase.units.fs  # Å/fs
        fastest = int(np.argmax(largest))
        speed = largest[fastest]
        raise StructureError(
            f"{where} has velocities of kinetic temperature {temperature_K:.3g} K, above the "
            f"bound of {MAX_INITIAL_TEMPERATURE_K:.0e} K (atom {fastest} has a velocity "
            f"component of {speed:.3g} Å/fs); check the velocities' units (ASE's, not Å/fs), "
            "or remove them (atoms.set_momenta(None)) and draw them with initial_temperature_K"
        )
