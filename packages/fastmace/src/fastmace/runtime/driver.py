"""The NVIDIA driver's version, asked of ``nvidia-smi`` (no CUDA library is loaded)."""

from __future__ import annotations

import shutil
import subprocess


def nvidia_driver_version() -> str | None:
    """The driver version(s) ``nvidia-smi`` reports, or None without a driver."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return None
    try:
        result = subprocess.run(
            [nvidia_smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    versions = sorted(set(result.stdout.split()))
    return ", ".join(versions) if result.returncode == 0 and versions else None
