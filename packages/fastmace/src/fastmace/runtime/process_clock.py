"""How long this process has been running: the start of "time to first step".

A user's clock starts when they type ``fastmace md``, not when FastMACE's code first runs, so
the start-up report counts from the process's own start time as the kernel recorded it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# /proc/self/stat's fields after the command name, which is in parentheses and may hold spaces:
# starttime is field 22 of the line, the 20th after the name.
_STARTTIME_AFTER_NAME = 19


def seconds_since_process_start() -> float | None:
    """Wall seconds since this process started, or None where the kernel does not say (not
    Linux). Resolution: one clock tick (10 ms)."""
    if not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[_STARTTIME_AFTER_NAME])
        per_second = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    # starttime counts from boot on the same clock as CLOCK_BOOTTIME (time namespaces included).
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / per_second
