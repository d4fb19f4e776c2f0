"""mace-torch's model code without its training tools.

``import mace.modules`` runs ``mace/tools/__init__.py``, which imports the trainer
(``mace.tools.train``: torchmetrics, which imports torchvision and its models; torch_ema), the
argument parser and the fine-tuning helpers: about 7 of the 11 seconds mace-torch's import
took on the GPU machine (docs/validation/performance.md), for nothing a model needs. The model
modules take from the package only submodules and two names (``TensorDict`` and ``to_numpy``).

:func:`mace_tools_without_trainer` registers ``mace.tools`` as a package whose ``__init__``
has not run yet: its submodules import as usual, the names above resolve from the submodule
that defines them, and any other name of the package (``mace.tools.train``'s functions, the
argument parser) runs the package's own ``__init__`` at that moment, so code that uses them
works as before and pays what it paid before. mace-torch's files are not changed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

# The names mace-torch's model modules import from the package itself, and where they live.
_LIGHT_NAMES = {"TensorDict": "torch_tools", "to_numpy": "torch_tools"}
_LOCK = threading.RLock()


def mace_tools_without_trainer() -> None:
    """Make ``mace.tools`` importable without its ``__init__`` (a no-op once it is imported)."""
    with _LOCK:
        if "mace.tools" in sys.modules:
            return
        import mace  # its own __init__ only (a version and one variable; see contained())

        spec = importlib.util.find_spec("mace.tools")
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return  # not the package layout this was written for: import it as it is
        package = importlib.util.module_from_spec(spec)
        package.__getattr__ = _PackageNames(package)  # type: ignore[attr-defined]
        sys.modules["mace.tools"] = package
        mace.tools = package  # type: ignore[attr-defined]


class _PackageNames:
    """A not-yet-initialised package's ``__getattr__``: submodules, then the light names, then
    the package's own ``__init__`` for everything else."""

    def __init__(self, package: ModuleType) -> None:
        self.package = package
        self.initialised = False

    def __call__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.package.__name__}.{name}"
        if importlib.util.find_spec(full) is not None:
            return importlib.import_module(full)
        if name in _LIGHT_NAMES and not self.initialised:
            where = importlib.import_module(f"{self.package.__name__}.{_LIGHT_NAMES[name]}")
            return getattr(where, name)
        self._initialise()
        if name not in self.package.__dict__:
            raise AttributeError(f"module {self.package.__name__!r} has no attribute {name!r}")
        return self.package.__dict__[name]

    def _initialise(self) -> None:
        """Run the package's own ``__init__`` in it, once (the trainer and all)."""
        with _LOCK:
            if self.initialised:
                return
            self.initialised = True
            spec = self.package.__spec__
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(self.package)
