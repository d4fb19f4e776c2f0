"""How OpenEquivariance's host extension will be obtained here: prebuilt, built, or not at all.

One decision, made from files and ``PATH`` only (nothing imported, nothing written), shared by
``fastmace doctor`` (which reports it) and the runtime (which acts on it):

- the ``fastmace-oeq-ext`` wheel when its manifest matches, unless ``FASTMACE_OEQ_PREBUILT=0``;
- otherwise a build with the host toolchain (a C++ compiler, ninja, the CUDA 13 runtime wheel,
  the driver), unless ``FASTMACE_OEQ_PREBUILT=1`` refuses it;
- otherwise unavailable, with every reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fastmace.oeq import toolchain
from fastmace.oeq.prebuilt import PrebuiltExtension, prebuilt_extension
from fastmace.runtime import environment

PREBUILT = "prebuilt"
TOOLCHAIN = "toolchain"
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class HostExtensionChoice:
    """The method, what it needs, and why the others were not taken."""

    method: str
    """``prebuilt``, ``toolchain`` or ``unavailable``."""
    reason: str
    """Why this method; for ``unavailable``, everything that is missing."""
    prebuilt: PrebuiltExtension | None
    prebuilt_skipped: str | None
    """Why the wheel is not used (None when it is)."""
    driver: Path | None
    driver_source: str
    compiler: str | None
    ninja: str | None

    @property
    def usable(self) -> bool:
        return self.method != UNAVAILABLE


def choose_host_extension(environ: Mapping[str, str] | None = None) -> HostExtensionChoice:
    """Decide how the host extension would be obtained in this environment."""
    setting = environment.oeq_prebuilt(environ)
    driver, driver_source = toolchain.find_driver_library(environ)
    if setting is False:
        extension, skipped = None, "FASTMACE_OEQ_PREBUILT=0"
    else:
        status = prebuilt_extension()
        extension, skipped = status.extension, (None if status.extension else status.reason)
    compiler, ninja = toolchain.find_cxx(environ), toolchain.find_ninja()

    def choice(method: str, reason: str) -> HostExtensionChoice:
        return HostExtensionChoice(
            method, reason, extension, skipped, driver, driver_source, compiler, ninja
        )

    if extension is not None:
        return choice(
            PREBUILT,
            f"fastmace-oeq-ext {extension.version} matches this environment (its library for "
            f"torch {extension.built_for_torch})",
        )
    if setting is True:
        return choice(
            UNAVAILABLE,
            f"FASTMACE_OEQ_PREBUILT=1 refuses the toolchain build and the prebuilt extension "
            f"cannot be used ({skipped}): install the fastmace-oeq-ext wheel built for this "
            "torch, or unset FASTMACE_OEQ_PREBUILT",
        )
    needs = (
        ("a C++ compiler", compiler, "install g++"),
        ("ninja", ninja, "pip install ninja, with the environment's bin on PATH"),
        (
            "the CUDA 13 runtime wheel",
            toolchain.cuda_wheel_library("libcudart"),
            "pip install 'nvidia-cuda-runtime==13.*'",
        ),
        (
            "the CUDA 13 compiler headers",
            toolchain.cuda_wheel_header("crt/host_config.h"),
            "pip install 'nvidia-cuda-crt==13.0.*' 'nvidia-cuda-cccl==13.0.*'",
        ),
        (
            "libcuda.so.1",
            driver,
            f"{driver_source}: install the NVIDIA driver or set OEQ_CUDA_DRIVER_LIBRARY",
        ),
    )
    missing = [f"{name} ({fix})" for name, found, fix in needs if not found]
    if missing:
        return choice(
            UNAVAILABLE,
            f"the prebuilt extension is not used ({skipped}) and the host toolchain build "
            "cannot run; missing: " + "; ".join(missing),
        )
    return choice(TOOLCHAIN, f"built with the host toolchain; prebuilt not used: {skipped}")
