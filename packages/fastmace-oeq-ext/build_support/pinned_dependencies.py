"""scikit-build-core metadata provider: the torch range the libraries are built for.

A compiled torch extension only loads into the torch minor version it was compiled against,
so the wheel's torch requirement spans exactly the minors it holds a library for
(``torch>=2.11,<2.15`` for libraries built against 2.11 to 2.14), read from the same torches
build_inputs.py describes rather than written by hand. A torch inside that range without its
own library (a minor skipped in the build) is refused by FastMACE with the reason.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

OPENEQUIVARIANCE = "0.7.0"


def torch_requirement() -> str:
    sys.path.insert(0, str(Path(__file__).parent))  # build_inputs, beside this file
    from build_inputs import torches

    minors = [tuple(map(int, torch["torch_minor"].split("."))) for torch in torches()]
    (low_major, low_minor), (high_major, high_minor) = minors[0], minors[-1]
    return f"torch>={low_major}.{low_minor},<{high_major}.{high_minor + 1}"


def dynamic_metadata(field: str, settings: object = None, project: object = None) -> list[str]:
    if field != "dependencies":
        raise ValueError(f"this provider only fills 'dependencies', not {field!r}")
    oeq = metadata.version("openequivariance")
    if oeq != OPENEQUIVARIANCE:
        raise RuntimeError(
            f"the build environment has openequivariance {oeq}; this wheel is built from "
            f"{OPENEQUIVARIANCE}'s sources"
        )
    return [torch_requirement(), f"openequivariance=={OPENEQUIVARIANCE}"]
