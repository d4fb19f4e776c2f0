"""A stand-in for malicious code in a checkpoint: an object whose unpickling creates a file."""

from __future__ import annotations

from pathlib import Path


class WritesMarker:
    """Unpickling this opens (creates) the marker file: the stand-in for malicious code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))
