"""scikit-build-core metadata provider: pin torch to the release the library is built against.

A compiled torch extension only loads into the torch it was compiled for, so the wheel's
``torch==`` requirement is read from the build environment's torch (without its ``+cuXXX``
local tag, which an index requirement cannot name) rather than written by hand.
"""

from __future__ import annotations

from importlib import metadata

OPENEQUIVARIANCE = "0.7.0"


def dynamic_metadata(field: str, settings: object = None, project: object = None) -> list[str]:
    if field != "dependencies":
        raise ValueError(f"this provider only fills 'dependencies', not {field!r}")
    torch_release = metadata.version("torch").split("+")[0]
    oeq = metadata.version("openequivariance")
    if oeq != OPENEQUIVARIANCE:
        raise RuntimeError(
            f"the build environment has openequivariance {oeq}; this wheel is built from "
            f"{OPENEQUIVARIANCE}'s sources"
        )
    return [f"torch=={torch_release}", f"openequivariance=={OPENEQUIVARIANCE}"]
