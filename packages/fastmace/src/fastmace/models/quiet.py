"""Library warnings that tell a FastMACE user nothing, silenced around the calls that raise them.

Each is raised inside mace-torch, e3nn or torch about their own code, which FastMACE calls as
it is; the user can do nothing about it. Filters are set only within :func:`library_noise_
silenced` (``warnings.catch_warnings``), never process-wide, and match one message each, so
every other warning still reaches the user.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

NOISE: tuple[tuple[type[Warning], str], ...] = (
    # e3nn and mace-torch script their modules, and torch's deepcopy and unpickling of scripted
    # modules go through torch.jit.save/load: deprecations addressed to those libraries.
    (FutureWarning, r"`torch\.jit\.(script|load|save)` is deprecated"),
    # mace-torch sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD when imported (contained() removes it
    # again), and e3nn's load of its own constants right after trips over it.
    (UserWarning, r"Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected"),
)


@contextlib.contextmanager
def library_noise_silenced() -> Iterator[None]:
    """Within the block, the warnings of :data:`NOISE` are not shown; the filters are put back
    as they were when it ends."""
    with warnings.catch_warnings():
        for category, message in NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
