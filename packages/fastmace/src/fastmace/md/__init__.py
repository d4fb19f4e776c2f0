"""The MD engine: batched device state, neighbour list, potential, integrators, captured step.

``fastmace.md`` is also the function users call, ``fm.md(structure, model=..., ...)``
(:func:`fastmace.api.md`): Python binds a package's submodules as attributes of the package,
so a function of that name beside this package would be replaced by the package on first
import. Calling the package therefore runs :func:`fastmace.api.md`.
"""

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from fastmace.api import md

        return md(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
