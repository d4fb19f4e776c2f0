"""Run output on the host: trajectory, thermo log, restarts, progress and the final report.

The engine hands this room plain data once per block (``ase.Atoms``, NumPy arrays, floats);
nothing here imports torch. Start with :meth:`RunDirectory.create` or
:meth:`RunDirectory.resume`; docs/output.md describes the files.
"""

from fastmace.io.progress import Progress
from fastmace.io.restart import Restart, RestartFormatError, load_restart, save_restart
from fastmace.io.run_directory import (
    DiskFullError,
    OccupiedRunDirectoryError,
    RunDirectory,
    RunDirectoryError,
    RunDirectoryInUseError,
    RunOutput,
)
from fastmace.io.schedule import OutputSchedule
from fastmace.io.thermo import STANDARD_COLUMNS as THERMO_COLUMNS
from fastmace.io.trajectory import choose_format, read_trajectory

__all__ = [
    "THERMO_COLUMNS",
    "DiskFullError",
    "OccupiedRunDirectoryError",
    "OutputSchedule",
    "Progress",
    "Restart",
    "RestartFormatError",
    "RunDirectory",
    "RunDirectoryError",
    "RunDirectoryInUseError",
    "RunOutput",
    "choose_format",
    "load_restart",
    "read_trajectory",
    "save_restart",
]
