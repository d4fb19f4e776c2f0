"""How many edges a force evaluation works through at once: the rule, from measured numbers.

Pure arithmetic (no torch): the engine's set-up measures the free device memory and asks the
model what one row of per-edge intermediates costs (dynamics/edge_chunks.py), and this rule
turns them into ``edge_chunk_rows``. A potential whose rows (edges, or pairs of mirrored edges)
are no more than that evaluates them all at once, as before; more are worked through in
chunks of that many, so that a large cell's memory grows with its atoms and not with a whole
set of per-edge intermediates (docs/md.md#how-big-a-run-fits).
"""

from __future__ import annotations

from dataclasses import dataclass

# Of the device memory free at set-up, the share the per-edge intermediates of one evaluation
# may take. The rest holds the per-atom tensors, the neighbour list and the CUDA graph's pool.
EDGE_MEMORY_SHARE = 0.25
# Fewer rows than this per chunk would spend more time launching kernels than computing.
MIN_CHUNK_ROWS = 4096
# Kernels that address a row's weights with 32-bit offsets (cuEquivariance's, measured to fail
# with an illegal address past it on an H200) need rows x weights below this.
INDEX_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class EdgeChunking:
    """The rule's answer: the rows an evaluation takes at once, and why."""

    rows: int
    reason: str


def edge_chunking(free_bytes: int, bytes_per_row: int, widest_row: int = 1) -> EdgeChunking:
    """Rows of per-edge intermediates that fit in EDGE_MEMORY_SHARE of ``free_bytes``, and
    whose weights (``widest_row`` numbers per row in the widest block) stay addressable with
    32-bit offsets."""
    if free_bytes <= 0 or bytes_per_row <= 0:
        raise ValueError(
            f"need positive free memory and row size, got {free_bytes} and {bytes_per_row} bytes"
        )
    rows = max(MIN_CHUNK_ROWS, int(EDGE_MEMORY_SHARE * free_bytes // bytes_per_row))
    reason = (
        f"rule: per-edge intermediates within {EDGE_MEMORY_SHARE:.0%} of the "
        f"{free_bytes / 2**30:.1f} GiB free at set-up, {bytes_per_row} bytes per row"
    )
    addressable = INDEX_LIMIT // max(widest_row, 1)
    if addressable < rows:
        rows = addressable
        reason += f", and {widest_row} weights per row addressable with 32-bit offsets"
    reason += f": at most {rows} rows (edges, or mirrored pairs) at once; more go in chunks"
    return EdgeChunking(rows=rows, reason=reason)
