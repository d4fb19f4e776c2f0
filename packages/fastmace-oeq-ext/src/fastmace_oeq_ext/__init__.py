"""OpenEquivariance 0.7.0's host extension, prebuilt for FastMACE.

This package holds ``libtorch_tp_jit.so`` and a ``manifest.json`` describing what it was
built against. FastMACE checks the manifest before it loads anything; importing this package
does nothing else.
"""

from pathlib import Path

LIBRARY = Path(__file__).with_name("libtorch_tp_jit.so")
MANIFEST = Path(__file__).with_name("manifest.json")
