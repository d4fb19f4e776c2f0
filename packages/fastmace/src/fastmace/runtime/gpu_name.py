"""The visible GPU's name, asked of NVML, so that planning does not start CUDA.

The plan's environment (the allocator's settings, cuBLAS's) takes effect only if it is set
before CUDA starts in the process, and ``torch.cuda.get_device_name`` starts it: the caching
allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` once, when torch initialises CUDA. The planner needs
the name before that (the compile cost's identity, the reasons it gives), so it asks the
driver's management library instead, found the way the dynamic loader finds it (on many
clusters and containers the driver's libraries sit in a directory known only to ``ldconfig``).

The answer is given only when it is certain: every GPU that CUDA may see carries the same
name. Otherwise (mixed GPUs, MIG instances, no NVML) it is None, and the caller asks torch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_SUCCESS = 0
NAME_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE


def visible_selectors(value: str | None) -> list[int | str] | None:
    """``CUDA_VISIBLE_DEVICES`` read as CUDA reads it: indices or ``GPU-`` UUIDs, up to the
    first entry that is neither (CUDA ignores the rest). None when unset (every GPU is
    visible); an empty list when nothing is. ``MIG-`` entries give None: a MIG instance's
    name is not its parent GPU's."""
    if value is None:
        return None
    selectors: list[int | str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith("MIG-"):
            return None
        if entry.startswith("GPU-"):
            selectors.append(entry)
        elif entry.lstrip("-").isdigit() and int(entry) >= 0:
            selectors.append(int(entry))
        else:
            break
    return selectors


def one_name(names: list[str]) -> str | None:
    """The name all visible GPUs share, or None when there are none or they differ."""
    return names[0] if names and len(set(names)) == 1 else None


def visible_gpu_name(environ: Mapping[str, str]) -> str | None:
    """The name of the GPUs CUDA will see, from NVML; None when it cannot be told for sure."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    selectors = visible_selectors(raw)
    if raw is not None and selectors is None:
        return None
    try:
        nvml = ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return None
    if nvml.nvmlInit_v2() != NVML_SUCCESS:
        return None
    try:
        return one_name(_names(nvml, selectors))
    except (AttributeError, OSError):  # an NVML too old for these calls
        return None
    finally:
        nvml.nvmlShutdown()


def _names(nvml: ctypes.CDLL, selectors: list[int | str] | None) -> list[str]:
    """The names of the devices to compare. CUDA numbers GPUs fastest first unless told
    otherwise, and NVML by PCI bus, so an index may name another device: with indices, every
    GPU on the machine must share the name; with UUIDs, those named."""
    if selectors is None or any(isinstance(s, int) for s in selectors):
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
            return []
        selectors = list(range(count.value))
    names = []
    for selector in selectors:
        handle = ctypes.c_void_p()
        if isinstance(selector, int):
            found = nvml.nvmlDeviceGetHandleByIndex_v2(selector, ctypes.byref(handle))
        else:
            found = nvml.nvmlDeviceGetHandleByUUID(selector.encode(), ctypes.byref(handle))
        if found != NVML_SUCCESS:
            return []  # CUDA would see fewer devices than asked for: no certain answer
        buffer = ctypes.create_string_buffer(NAME_BUFFER)
        if nvml.nvmlDeviceGetName(handle, buffer, NAME_BUFFER) != NVML_SUCCESS:
            return []
        names.append(buffer.value.decode(errors="replace"))
    return names
