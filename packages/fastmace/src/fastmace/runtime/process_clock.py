"""How long this process has been running: the start of "time to first step".

A user's clock starts when they type ``fastmace md``, not when FastMACE's code first runs, so
the start-up report counts from the process's own start time as the kernel recorded it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# /proc/<pid>/stat's fields after the command name, which is in parentheses and may hold
# spaces: state is the 3rd field of the line (the 1st after the name), starttime the 22nd (the
# 20th after the name).
_STATE_AFTER_NAME, _STARTTIME_AFTER_NAME = 0, 19


def seconds_since_process_start() -> float | None:
    """Wall seconds since this process started, or None where the kernel does not say (not
    Linux). Resolution: one clock tick (10 ms)."""
    if not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    ticks = process_start_ticks("self")
    if ticks is None:
        return None
    # starttime counts from boot on the same clock as CLOCK_BOOTTIME (time namespaces included).
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


def process_start_ticks(pid: int | str) -> int | None:
    """When process ``pid`` (or ``"self"``) started, in clock ticks since boot; None when it
    does not exist or the system has no /proc. With the id, it names one process for good."""
    fields = _stat_fields(pid)
    try:
        return None if fields is None else int(fields[_STARTTIME_AFTER_NAME])
    except (IndexError, ValueError):
        return None


def process_state(pid: int | str) -> str | None:
    """The kernel's one-letter state of process ``pid`` ("Z": exited, not yet reaped)."""
    fields = _stat_fields(pid)
    return fields[_STATE_AFTER_NAME] if fields else None


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()
