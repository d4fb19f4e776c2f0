"""The run directory: where one MD run keeps its output, and the engine's per-block API to it.

Layout (see docs/output.md)::

    run.json            how this directory writes output (format, systems, schedule); ours
    run.lock            while a process runs it: who (fastmace.io.run_lock); gone at the end
    trajectory.extxyz   or trajectory.h5md: frames every ``trajectory_every`` steps
    thermo.csv          one row per system per thermo step
    restart.npz         the latest restart, replaced atomically
    metadata.json       what ran, with which software (written by the caller)
    report.txt          the final report (written by the caller)
    thermo.png          the plot of thermo.csv, at the end (by the caller; with matplotlib)

A directory with anything in it is never written over: :meth:`RunDirectory.create` refuses it,
and :meth:`RunDirectory.resume` continues it from its last restart. One process at a time
writes a run: both take ``run.lock``, and a live owner's lock is never taken over.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ase
import numpy as np

from fastmace.io import trajectory
from fastmace.io.frames import Frame, make_frame
from fastmace.io.plot import PLOT_FILE, plot_thermo
from fastmace.io.restart import Restart, load_restart, save_restart
from fastmace.io.run_lock import LOCK_NAME, LockHeld, LockOwner, RunLock, held_by_live_process
from fastmace.io.schedule import OutputSchedule
from fastmace.io.thermo import ThermoLog, truncate_thermo
from fastmace.runtime.atomic import atomic_write_text, create_exclusive, remove_temporaries

RUN_FORMAT = "fastmace-run"
RUN_VERSION = 1


class RunDirectoryError(RuntimeError):
    """A run directory cannot be created or resumed as asked."""


# A run directory whose run stopped (or is still starting) before it wrote the restart of
# step 0: nothing can be resumed, and the directory is never overwritten.
_UNSTARTED = (
    "its run wrote no restart yet (restart.npz, written at step 0), so it was stopped while "
    "starting, or is starting now, and there is nothing to resume. Once no process runs it, "
    "remove the directory and start again, or start the run in another directory"
)


class DiskFullError(RunDirectoryError):
    """A run stopped because its directory's disk (or the user's quota there) is full."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is a write refused for want of space or quota."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


class OccupiedRunDirectoryError(RunDirectoryError):
    """A new run was asked for in a directory that already holds output."""

    def __init__(self, path: Path, entries: list[str], resume_how: str = "resume=True") -> None:
        self.path = path
        self.entries = entries
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        if "run.json" in entries and "restart.npz" not in entries:
            # Advising a resume here would send the user round in a circle: there is none.
            super().__init__(f"run directory {path} already holds output ({shown}); {_UNSTARTED}")
            return
        super().__init__(
            f"run directory {path} already holds output ({shown}) and is never overwritten; "
            f"choose another directory, or continue that run with {resume_how}"
        )

    def advising(self, resume_how: str) -> OccupiedRunDirectoryError:
        """The same error, telling how to resume in the caller's words (``--resume``...)."""
        return OccupiedRunDirectoryError(self.path, self.entries, resume_how)


class RunDirectoryInUseError(RunDirectoryError):
    """Another live process runs this directory (its ``run.lock``)."""

    def __init__(self, path: Path, owner: LockOwner | None) -> None:
        self.path = path
        self.owner = owner
        who = owner.describe() if owner is not None else "another process"
        super().__init__(
            f"run directory {path} is in use by {who}: two processes must never write one run. "
            "Wait for that run to end, or stop it; if that process no longer exists (it ran "
            f"on another host that crashed), delete {path / LOCK_NAME} and try again"
        )


@dataclass(frozen=True)
class RunDirectory:
    """The paths of a run directory; :meth:`create` and :meth:`resume` open it for output."""

    path: Path

    @property
    def settings_path(self) -> Path:
        return self.path / "run.json"

    @property
    def thermo_path(self) -> Path:
        return self.path / "thermo.csv"

    @property
    def restart_path(self) -> Path:
        return self.path / "restart.npz"

    @property
    def metadata_path(self) -> Path:
        return self.path / "metadata.json"

    @property
    def report_path(self) -> Path:
        return self.path / "report.txt"

    @property
    def plot_path(self) -> Path:
        return self.path / PLOT_FILE

    def trajectory_path(self, trajectory_format: str, by_temperature: bool = False) -> Path:
        """The walkers' trajectory, or with ``by_temperature`` a replica-exchange run's
        trajectory by rung of the ladder."""
        names = trajectory.BY_TEMPERATURE_FILE_NAMES if by_temperature else trajectory.FILE_NAMES
        return self.path / names[trajectory_format]

    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        n_atoms: int,
        n_systems: int = 1,
        n_steps: int | None = None,
        schedule: OutputSchedule | None = None,
        trajectory_format: str = "auto",
    ) -> RunOutput:
        """Start a new run in ``path``, which must be absent or empty.

        Args:
            n_atoms: atoms of all systems together.
            n_systems: systems in the batch.
            n_steps: the run's length, for the ``"auto"`` format choice (1000 frames assumed
                when not given).
            schedule: output intervals (defaults: :class:`OutputSchedule`).
            trajectory_format: ``"auto"``, ``"extxyz"``, ``"h5md"`` or ``"none"``.
        """
        schedule = OutputSchedule() if schedule is None else schedule
        if n_systems < 1 or n_atoms < n_systems:
            raise ValueError(
                f"need at least one system and one atom per system, got n_systems={n_systems}, "
                f"n_atoms={n_atoms}"
            )
        expected = None if n_steps is None else schedule.expected_frames(n_steps)
        chosen = trajectory.choose_format(trajectory_format, n_atoms, expected)
        if schedule.trajectory_every == 0:
            chosen = "none"
        directory = cls(Path(path))
        directory._claim_empty()
        lock = directory._lock()
        settings = {
            "format": RUN_FORMAT,
            "version": RUN_VERSION,
            "trajectory_format": chosen,
            "n_atoms": n_atoms,
            "n_systems": n_systems,
            "schedule": schedule.to_dict(),
        }
        document = (json.dumps(settings, indent=2) + "\n").encode("utf-8")
        try:
            create_exclusive(directory.settings_path, document)
        except FileExistsError:
            lock.release()
            raise directory._occupied_error(["run.json"]) from None
        except OSError as error:  # the file name would be our hidden temporary's: say where
            lock.release()
            raise directory._unwritable(error) from None
        return RunOutput(directory, settings, restart=None, lock=lock)

    @classmethod
    def resume(cls, path: str | Path) -> RunOutput:
        """Reopen a run at its last restart; output written after that restart is dropped.

        The returned output's :attr:`RunOutput.restart` holds the engine's payload.
        """
        directory = cls(Path(path))
        settings = directory._read_settings()
        lock = directory._lock()  # before anything is cut back: a live run keeps its files
        try:
            remove_temporaries(directory.path)  # left by a process killed mid-write
            if not directory.restart_path.is_file():
                raise RunDirectoryError(
                    f"cannot resume {directory.path}: {directory._missing_restart()}"
                )
            restart = load_restart(directory.restart_path)
            directory._check_trajectory_format(settings)
            kept = directory._truncate_after(settings["trajectory_format"], restart.step)
            directory._check_no_gap(settings, restart.step, kept)
        except BaseException:
            lock.release()
            raise
        return RunOutput(directory, settings, restart=restart, lock=lock)

    def _missing_restart(self) -> str:
        """Why there is no restart, and what to do, without advice that loses output."""
        # A run killed while starting may have written step 0's frame and row, not more; one
        # that wrote a report or thermo rows past step 0 had a restart, now gone.
        rows = 0
        if self.thermo_path.is_file():
            with open(self.thermo_path, encoding="utf-8", errors="replace") as stream:
                rows = sum(1 for _ in stream) - 1
        if not self.report_path.is_file() and rows <= 1:
            return _UNSTARTED
        return (
            "its restart.npz is missing (deleted, or lost), though the run wrote output past "
            "step 0: there is nothing to continue from. Keep this directory as it is (its "
            "output stays valid up to where it ends) and run the rest as a new run in another "
            "directory, starting from its last frame"
        )

    def _lock(self) -> RunLock:
        """This process's hold on the directory (RunDirectoryInUseError if another has it)."""
        try:
            return RunLock.acquire(self.path)
        except LockHeld as held:
            raise RunDirectoryInUseError(self.path, held.owner) from None
        except OSError as error:
            raise self._unwritable(error) from None

    def _unwritable(self, error: OSError) -> RunDirectoryError:
        return RunDirectoryError(
            f"cannot write in run directory {self.path}: {error.strerror or error}; "
            "choose a directory you can write to, or change its permissions"
        )

    def _check_trajectory_format(self, settings: Mapping[str, Any]) -> None:
        """Refuse a run.json whose trajectory format was edited: the resumed run would start
        a second trajectory file in the new format beside the run's own."""
        named = settings["trajectory_format"]
        for other, name in trajectory.FILE_NAMES.items():
            if other != named and (self.path / name).is_file():
                raise RunDirectoryError(
                    f"cannot resume {self.path}: run.json says the trajectory is {named!r}, but "
                    f"the run wrote {name}: run.json was edited since. Put "
                    f'"trajectory_format": "{other}" back in run.json (a resumed run keeps one '
                    "trajectory file)"
                )

    def _check_no_gap(self, settings: Mapping[str, Any], step: int, kept: dict[Path, int]) -> None:
        """Refuse to resume when the thermo log or the trajectory lacks output the run wrote
        before its restart (a file cut by hand, or restored from an older copy): the resumed
        run would continue after a silent gap of steps."""
        schedule = OutputSchedule.from_dict(settings["schedule"])
        n_systems = int(settings["n_systems"])
        # (interval, entries per output step): thermo.csv holds a row per system, and each
        # trajectory format says what it counts.
        intervals = {self.thermo_path: (schedule.thermo_every, n_systems)}
        trajectory_format = settings["trajectory_format"]
        if trajectory_format != "none":
            per_system = trajectory.FRAMES_PER_STEP_PER_SYSTEM[trajectory_format]
            per_step = n_systems if per_system else 1
            intervals[self.trajectory_path(trajectory_format)] = (
                schedule.trajectory_every,
                per_step,
            )
        for path, (every, per_step) in intervals.items():
            if every <= 0 or path not in kept:
                continue
            expected = per_step * (step // every + 1)  # step 0 and every multiple to the restart
            if kept[path] < expected:
                raise RunDirectoryError(
                    f"cannot resume {self.path}: {path.name} holds {kept[path]} entries up to "
                    f"step {step}, where the run wrote {expected} (every {every} steps from step "
                    "0, per system): it was cut or replaced since. Resuming would leave a gap of "
                    "steps. Put the complete file back, or start the run again in a new directory"
                )

    def _truncate_after(self, trajectory_format: str, step: int) -> dict[Path, int]:
        """Drop output written after ``step``: the resumed run writes it again. Returns how
        many rows or frames each file kept."""
        kept: dict[Path, int] = {}
        files = (
            []
            if trajectory_format == "none"
            else [self.trajectory_path(trajectory_format, by) for by in (False, True)]
        )
        for path in [*files, self.thermo_path]:
            if not path.is_file():
                continue
            try:
                if path == self.thermo_path:
                    kept[path] = truncate_thermo(path, step)
                else:
                    kept[path] = trajectory.truncate_trajectory(trajectory_format, path, step)
            except (OSError, ValueError) as error:
                raise RunDirectoryError(
                    f"cannot resume {self.path}: {path.name} cannot be read ({error}); it was "
                    "probably damaged outside FastMACE. Start the run again in a new directory "
                    "or repair the file"
                ) from error
        return kept

    def check_can_create(self) -> None:
        """Raise what :meth:`create` would about the place, creating nothing: a file in the
        way, output already there (:class:`OccupiedRunDirectoryError`), or no right to write."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(
                f"run directory {self.path} is a file; choose a directory path for the output"
            )
        if self.path.is_dir():
            entries = sorted(entry.name for entry in self.path.iterdir())
            if entries:
                raise self._occupied_error(entries)
        existing = _nearest_existing(self.path)
        if not existing.is_dir():
            raise RunDirectoryError(
                f"cannot create run directory {self.path}: {existing} is a file, not a "
                "directory; choose another path for the output"
            )
        if not os.access(existing, os.W_OK | os.X_OK):
            raise RunDirectoryError(
                f"cannot create run directory {self.path}: this process may not write in "
                f"{existing} ({_why_not_writable(existing)}); choose a directory you can write "
                "to, or change its permissions"
            )

    def check_can_resume(self) -> None:
        """Raise what :meth:`resume` would about the directory before reading its restart."""
        self._read_settings()
        owner = held_by_live_process(self.path)
        if owner is not None:
            raise RunDirectoryInUseError(self.path, owner)
        if not self.restart_path.is_file():
            raise RunDirectoryError(f"cannot resume {self.path}: {self._missing_restart()}")

    def _claim_empty(self) -> None:
        self.check_can_create()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunDirectoryError(
                f"cannot create run directory {self.path}: {error.strerror or error}; choose a "
                "directory you can write to"
            ) from None

    def _occupied_error(self, entries: list[str]) -> OccupiedRunDirectoryError:
        return OccupiedRunDirectoryError(self.path, entries)

    def _read_settings(self) -> dict[str, Any]:
        if not self.path.is_dir():
            raise RunDirectoryError(f"cannot resume {self.path}: it is not a directory")
        try:
            settings = json.loads(self.settings_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunDirectoryError(
                f"cannot resume {self.path}: it has no run.json, so it is not a FastMACE run "
                "directory"
            ) from None
        except (OSError, ValueError) as error:
            raise RunDirectoryError(f"cannot read {self.settings_path}: {error}") from None
        if settings.get("format") != RUN_FORMAT or settings.get("version") != RUN_VERSION:
            raise RunDirectoryError(
                f"{self.settings_path} is not a version-{RUN_VERSION} FastMACE run description"
            )
        return settings


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _why_not_writable(directory: Path) -> str:
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError:
        pass
    return "no write permission, or the directory is immutable"


class RunOutput:
    """The engine's output for one session of a run: call these once per block, then close.

    At a step that has a frame, thermo rows and a restart, write the frame and the rows first:
    a restart makes everything written before it durable, and resuming drops what came later.
    Use :meth:`RunDirectory.create` or :meth:`RunDirectory.resume` to get one.
    """

    def __init__(
        self,
        directory: RunDirectory,
        settings: Mapping[str, Any],
        restart: Restart | None,
        lock: RunLock | None = None,
    ) -> None:
        self.directory = directory
        self.lock = lock  # released by close()
        self.trajectory_format: str = settings["trajectory_format"]
        self.n_atoms: int = settings["n_atoms"]
        self.n_systems: int = settings["n_systems"]
        self.schedule = OutputSchedule.from_dict(settings["schedule"])
        self.restart = restart
        self._last_frame_step = -1 if restart is None else restart.step
        self._trajectory: trajectory.TrajectoryWriter | None = None
        self._by_temperature: trajectory.TrajectoryWriter | None = None
        self._thermo: ThermoLog | None = None
        self._closed = False

    @property
    def trajectory_path(self) -> Path | None:
        """The trajectory file (it exists once a frame was written), or None without one."""
        if self.trajectory_format == "none":
            return None
        return self.directory.trajectory_path(self.trajectory_format)

    def write_frames(
        self,
        step: int,
        time_fs: float,
        atoms: ase.Atoms | Sequence[ase.Atoms],
        energies: float | Sequence[float] | np.ndarray | None = None,
        forces: np.ndarray | Sequence[np.ndarray] | None = None,
        *,
        walker_at_rung: Sequence[int] | None = None,
    ) -> None:
        """Append the frame of every system at ``step`` (energies in eV, forces in eV/Å).

        ``atoms`` holds one structure per system (``State.to_atoms()``), with velocities;
        ``forces`` is one (n_i, 3) array per system or one (N, 3) array of all atoms. For a
        replica-exchange run, ``walker_at_rung[r]`` is the system at rung r of the ladder: the
        frame is also appended to the trajectory by temperature, its system r being that one.
        """
        self._check_open()
        if self.trajectory_path is None:
            raise RunDirectoryError("this run writes no trajectory (trajectory format 'none')")
        frame = make_frame(step, time_fs, atoms, energies, forces)
        if len(frame.atoms) != self.n_systems:
            raise ValueError(f"expected {self.n_systems} systems, got {len(frame.atoms)}")
        if frame.step <= self._last_frame_step:
            raise ValueError(
                f"frame step {frame.step} is not after the last one written "
                f"({self._last_frame_step}); steps must increase"
            )
        if self._trajectory is None:
            self._trajectory = trajectory.open_writer(
                self.trajectory_format, self.trajectory_path, self.n_systems
            )
        self._trajectory.write(frame)
        if walker_at_rung is not None:
            if self._by_temperature is None:
                self._by_temperature = trajectory.open_writer(
                    self.trajectory_format,
                    self.directory.trajectory_path(self.trajectory_format, by_temperature=True),
                    self.n_systems,
                )
            self._by_temperature.write(_reordered(frame, walker_at_rung))
        self._last_frame_step = frame.step

    def write_thermo(self, rows: Iterable[Mapping[str, float | int | None]]) -> None:
        """Append thermo rows (see :mod:`fastmace.io.thermo` for the columns and units)."""
        self._check_open()
        self._thermo_log().write(rows)

    def write_restart(self, step: int, payload: Mapping[str, Any]) -> None:
        """Replace the restart with ``payload`` at ``step`` (see :mod:`fastmace.io.restart`).

        Frames and thermo rows already written are made durable first, so that a resume from
        this restart finds everything up to its step.
        """
        self._check_open()
        for writer in (self._trajectory, self._by_temperature):
            if writer is not None:
                writer.sync()
        if self._thermo is not None:
            self._thermo.sync()
        save_restart(self.directory.restart_path, step, payload)

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Replace metadata.json with ``metadata`` (JSON-serialisable), atomically."""
        self._check_open()
        text = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
        atomic_write_text(self.directory.metadata_path, text)

    def write_report(self, text: str) -> None:
        """Replace report.txt with ``text``, atomically."""
        self._check_open()
        atomic_write_text(self.directory.report_path, text if text.endswith("\n") else text + "\n")

    def write_plot(self) -> Path:
        """Draw thermo.csv into thermo.png (:mod:`fastmace.io.plot`), replacing it; its path.

        PlotUnavailableError without matplotlib.
        """
        self._check_open()
        return plot_thermo(self.directory.thermo_path, self.directory.plot_path)

    def keep_alive(self) -> None:
        """Tell other processes the run still goes on (the lock's heartbeat); once per block."""
        if self.lock is not None and not self._closed:
            self.lock.keep_alive()

    def close(self) -> None:
        """Flush and close the files and give the directory up; later writes raise. Closing
        twice is harmless."""
        if self._closed:
            return
        self._closed = True
        try:
            for writer in (self._trajectory, self._by_temperature, self._thermo):
                if writer is not None:
                    writer.close()
        finally:
            if self.lock is not None:
                self.lock.release()

    def __enter__(self) -> RunOutput:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _thermo_log(self) -> ThermoLog:
        if self._thermo is None:
            self._thermo = ThermoLog(self.directory.thermo_path, self.n_systems)
            if self.restart is not None:
                self._thermo.start_after(self.restart.step)
        return self._thermo

    def _check_open(self) -> None:
        if self._closed:
            raise RunDirectoryError(f"the output of {self.directory.path} is already closed")


def _reordered(frame: Frame, order: Sequence[int]) -> Frame:
    """``frame`` with system i taken from system ``order[i]``."""
    if sorted(order) != list(range(len(frame.atoms))):
        raise ValueError(f"walker_at_rung {list(order)} is not an order of the frame's systems")

    def pick(values: list | None) -> list | None:
        return None if values is None else [values[index] for index in order]

    return Frame(frame.step, frame.time_fs, pick(frame.atoms), pick(frame.energies),
                 pick(frame.forces))  # fmt: skip
