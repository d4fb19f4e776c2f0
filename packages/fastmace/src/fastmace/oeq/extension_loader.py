"""The one place FastMACE reaches into OpenEquivariance's internals: its extension loader.

OpenEquivariance 0.7.0 (``openequivariance/_torch/extlib/__init__.py``) loads its host
extension at import time with ``torch.utils.cpp_extension.load("libtorch_tp_jit", ...)``,
after waiting up to 300 s for a ``lock`` file in torch's extension directory. While mace-torch
(and so OpenEquivariance) is imported, :func:`intercepting_extension_load` replaces that one
function so the call for ``libtorch_tp_jit`` is answered by FastMACE (the prebuilt library or
the build-once cache); every other call passes through, and the original is put back when the
import is over. Checked against OpenEquivariance 0.7.0; ``tests/test_oeq_host_extension.py`` fails
when a new version changes the loader.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

CHECKED_VERSION = "0.7.0"
EXTENSION_NAME = "libtorch_tp_jit"
LOADER_MODULE = "openequivariance._torch.extlib"

# provide(real_load, sources, options) -> module; raising makes OEq record the extension as
# unavailable (it catches the error), which mace-torch then reports for OEq conversions.
Provider = Callable[[Callable[..., ModuleType], list, dict[str, Any]], ModuleType]


@contextlib.contextmanager
def _quiet_import_log() -> Iterator[None]:
    """torch logs "No CUDA runtime is found, using CUDA_HOME=..." when cpp_extension is first
    imported on a machine without a GPU: nothing is built there, so the line says nothing to
    the user. Its logger's level is raised for the import only, then put back."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def intercepting_extension_load(provide: Provider) -> Iterator[None]:
    """Within the block, ``cpp_extension.load("libtorch_tp_jit", ...)`` calls ``provide``."""
    with _quiet_import_log():
        import torch.utils.cpp_extension as cpp_extension

    real_load = cpp_extension.load

    def load(name: str, sources: Any, *args: Any, **kwargs: Any) -> ModuleType:
        if name != EXTENSION_NAME or args:
            return real_load(name, sources, *args, **kwargs)
        return provide(real_load, list(sources), kwargs)

    cpp_extension.load = load
    try:
        yield
    finally:
        cpp_extension.load = real_load
