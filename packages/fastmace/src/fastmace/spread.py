"""Several GPUs: a request's systems spread over devices, one child process per device.

``fm.md(..., gpus=N)`` (``--gpus N``, ``gpus = "all"``) cuts the systems of a request
(structures and their replicas, in order) into N consecutive parts of about equal atoms and
runs each part at once in a child process of its own (:mod:`fastmace.runner`) that sees one
GPU (``CUDA_VISIBLE_DEVICES``). Each part is an ordinary run, in ``gpu-0/``, ``gpu-1/``, ...
inside the run directory, with its systems' own settings and random streams (system ``s`` of
the request draws from ``seed + s`` on whichever device it runs), so a system follows the
trajectory it would follow on one GPU. ``devices.json`` records the cut; a resumed request
keeps it. The results come back together in the request's order, as batches' do
(:func:`fastmace.batching.merged_result`).

The systems never interact, so the processes exchange nothing while they run, except for
replica exchange: its walkers are spread like any systems, and at each block's end the
processes gather the whole ladder's energies (:mod:`fastmace.dynamics.exchange_group`) and
take the same swap decisions, each for its own walkers.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import ase

from fastmace.batching import is_per_system, merged_result
from fastmace.ensemble_catalog import setting_names
from fastmace.runner import ChildStopped, RunnerConfig, run_in_subprocess
from fastmace.runs import MDResult
from fastmace.runtime.atomic import atomic_write_text

DEVICE_DIRECTORY = "gpu-{index}"
SPREAD_FILE = "devices.json"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class SpreadError(ValueError):
    """A request that cannot be spread over the devices asked for."""


@dataclass(frozen=True)
class DeviceSlot:
    """One child process's device: its name for the report, and the variables that make the
    child see that device alone."""

    name: str
    environment: Mapping[str, str] = field(default_factory=dict)


def cuda_slots(gpus: int | str, visible: str | None, count: int) -> list[DeviceSlot]:
    """The devices for ``gpus`` (a number or ``"all"``) among the ``count`` CUDA devices this
    process sees; ``visible`` is this process's CUDA_VISIBLE_DEVICES (None: unset), whose
    entries the children's own values are taken from."""
    if gpus == "all":
        wanted = count
    elif isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 1:
        wanted = gpus
    else:
        raise SpreadError(f"gpus must be a positive whole number or 'all', got {gpus!r}")
    if count == 0:
        raise SpreadError(
            f"gpus={gpus!r} asks for CUDA GPUs, but this process sees none: run without gpus, "
            "or see `fastmace doctor`"
        )
    if wanted > count:
        raise SpreadError(
            f"gpus={gpus!r} asks for {wanted} GPUs, but this process sees {count}: ask for "
            f"at most {count}, or gpus='all'"
        )
    entries = [entry.strip() for entry in visible.split(",")] if visible else None
    names = entries[:count] if entries else [str(index) for index in range(count)]
    return [
        DeviceSlot(
            f"cuda:{index} ({VISIBLE_DEVICES}={names[index]})", {VISIBLE_DEVICES: names[index]}
        )
        for index in range(wanted)
    ]


def balanced_parts(atom_counts: Sequence[int], n_parts: int) -> list[range]:
    """``n_parts`` consecutive, non-empty ranges of systems with about equal atoms each (at
    most one part per system): part k starts at the first system whose middle lies past k
    equal shares of all the atoms."""
    n_parts = min(n_parts, len(atom_counts))
    middles = [done - count / 2 for done, count in zip(itertools.accumulate(atom_counts),
                                                       atom_counts, strict=True)]  # fmt: skip
    total = sum(atom_counts)
    cuts = [0]
    for part in range(1, n_parts):
        share = total * part / n_parts
        cut = next((i for i, middle in enumerate(middles) if middle >= share), len(middles))
        # Every part keeps at least one system.
        cuts.append(min(max(cut, cuts[-1] + 1), len(atom_counts) - (n_parts - part)))
    cuts.append(len(atom_counts))
    return [range(start, stop) for start, stop in itertools.pairwise(cuts)]


def part_arguments(
    arguments: Mapping[str, Any], part: range, n_systems: int, output: Path | None, resume: bool
) -> dict[str, Any]:
    """fm.md's keyword arguments for the systems in ``part`` (given to it as structures of
    their own: replicas and repeats already made): per-system values sliced, the seed moved so
    that each system keeps its stream, the part's own run directory."""
    chosen = dict(arguments)
    for name in (*setting_names(), "initial_temperature_K", "charge", "spin"):
        value = chosen.get(name)
        if is_per_system(value, n_systems):
            chosen[name] = list(value)[part.start : part.stop]
    chosen.update(
        replicas=1, repeat=None, gpus=None, seed=int(chosen.get("seed", 0)) + part.start,
        output=None if output is None else str(output), resume=resume,
    )  # fmt: skip
    return chosen


def saved_spread(output: str | Path | None) -> list[range] | None:
    """The cut of a spread request being resumed (None when it was not spread there)."""
    if output is None or not (Path(output) / SPREAD_FILE).exists():
        return None
    record = json.loads((Path(output) / SPREAD_FILE).read_text(encoding="utf-8"))
    return [range(start, stop) for start, stop in record["parts"]]


class _Prefixed:
    """A text stream that writes each line of a child's output with the child's prefix."""

    def __init__(self, stream: TextIO, prefix: str, lock: threading.Lock) -> None:
        self.stream, self.prefix, self.lock = stream, prefix, lock

    def write(self, text: str) -> int:
        with self.lock:
            self.stream.write(f"{self.prefix}{text}")
        return len(text)

    def flush(self) -> None:
        with self.lock:
            self.stream.flush()


def run_spread(
    arguments: Mapping[str, Any],
    structures: list[ase.Atoms],
    slots: Sequence[DeviceSlot],
    runner: RunnerConfig,
    progress: TextIO,
) -> MDResult:
    """Run ``fm.md(structures, **arguments)`` with its systems spread over ``slots``, each part
    at once in a child process; the merged result. Raises SpreadError for replica exchange,
    and the first failed part's error once every part has ended."""
    output = None if arguments.get("output") is None else Path(arguments["output"])
    resume = bool(arguments.get("resume"))
    parts = (saved_spread(output) if resume else None) or balanced_parts(
        [len(atoms) for atoms in structures], len(slots)
    )
    if parts[-1].stop != len(structures) or len(parts) > len(slots):
        raise SpreadError(
            f"the run in {output} was spread over {len(parts)} devices and "
            f"{parts[-1].stop} systems; resume it with the same structures and at least as "
            f"many GPUs (this request: {len(structures)} systems, {len(slots)} GPUs)"
        )
    names = [slot.name for slot in slots[: len(parts)]]
    if output is not None and not resume:
        output.mkdir(parents=True, exist_ok=True)
        record = {"parts": [[p.start, p.stop] for p in parts], "devices": names}
        atomic_write_text(output / SPREAD_FILE, json.dumps(record, indent=1) + "\n")
    lock = threading.Lock()
    groups = _exchange_groups(arguments, parts, output, len(structures))
    # A ladder's processes wait for each other at every exchange: once one part fails, the
    # others are stopped at once instead of waiting out the group's timeout.
    stop = threading.Event() if groups is not None else None

    def run_part(index: int) -> MDResult:
        part, slot = parts[index], slots[index]
        where = None if output is None else output / DEVICE_DIRECTORY.format(index=index)
        chosen = part_arguments(
            arguments, part, len(structures), where, resume and where is not None and where.exists()
        )
        if groups is not None:
            chosen["_exchange_group"] = groups[index]
        child = RunnerConfig(
            subprocess=True, environment={**runner.environment, **slot.environment},
            timeout_s=runner.timeout_s,
        )  # fmt: skip
        stream = _Prefixed(progress, f"[{DEVICE_DIRECTORY.format(index=index)}] ", lock)
        try:
            return run_in_subprocess(
                chosen, structures[part.start : part.stop], child, stream, stop
            )
        except BaseException:
            if stop is not None:
                stop.set()
            raise

    try:
        with ThreadPoolExecutor(max_workers=len(parts)) as pool:
            futures = [pool.submit(run_part, index) for index in range(len(parts))]
    finally:
        if groups is not None:  # the rendezvous file, and its directory when it made one
            Path(groups[0]["rendezvous"]).unlink(missing_ok=True)
            if output is None:
                Path(groups[0]["rendezvous"]).parent.rmdir()
    failures = [(index, f.exception()) for index, f in enumerate(futures) if f.exception()]
    # The part that failed first, not one stopped because of it.
    failures.sort(key=lambda failure: isinstance(failure[1], ChildStopped))
    if failures:  # each part's own error says what went wrong; this says where
        index, error = failures[0]
        stopped = sum(isinstance(e, ChildStopped) for _, e in failures)
        also = f" ({stopped} other part(s) of the ladder stopped for it)" if stopped else ""
        progress.write(f"the part on {names[index]} failed{also}; every other part has ended\n")
        raise error
    heading = (
        f"The request ran on {len(parts)} GPUs at once: "
        + "; ".join(
            f"systems {part.start} to {part.stop - 1} on {name}"
            for part, name in zip(parts, names, strict=True)
        )
        + ".\n"
    )
    return merged_result([f.result() for f in futures], parts, output, heading=heading, label="GPU")


def _exchange_groups(
    arguments: Mapping[str, Any], parts: Sequence[range], output: Path | None, n_systems: int
) -> list[dict[str, Any]] | None:
    """For replica exchange, each part's place in the spread ladder (None without exchange):
    the whole ladder, the request's seed and a rendezvous file new to this call."""
    if not arguments.get("exchange_every"):
        return None
    ladder = arguments.get("temperature_K")
    if not isinstance(ladder, list | tuple) or len(ladder) != n_systems:
        raise SpreadError(
            f"replica exchange needs temperature_K as one value per replica ({n_systems}), "
            "lowest first, e.g. fm.geometric_ladder(300, 600, replicas)"
        )
    where = output if output is not None else Path(tempfile.mkdtemp(prefix="fastmace-exchange-"))
    rendezvous = where / f".exchange-rendezvous-{uuid.uuid4().hex}"
    return [
        {"rank": rank, "parts": [[p.start, p.stop] for p in parts], "rendezvous": str(rendezvous),
         "ladder_K": [float(t) for t in ladder], "seed": int(arguments.get("seed", 0))}
        for rank in range(len(parts))
    ]  # fmt: skip
