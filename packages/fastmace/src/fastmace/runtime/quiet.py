"""Library warnings that tell a FastMACE user nothing, silenced around the calls that raise them.

Each is raised inside mace-torch, e3nn, cuEquivariance or torch about their own code, which
FastMACE calls as it is; the user can do nothing about it. Filters are set only within
:func:`library_noise_silenced` (``warnings.catch_warnings``), never process-wide, and match one
message each (and, where the text is a generic one, the module it is raised from), so every
other warning still reaches the user. OpenEquivariance's import notice is silenced where
FastMACE imports it (:mod:`fastmace.oeq.host_extension`).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_JIT_DEPRECATED = r"`torch\.jit\.(script|load|save)` is deprecated"


@dataclass(frozen=True)
class Noise:
    """One library warning: its category, the start of its message (a regular expression),
    the module it is attributed to ("" for any) and why it says nothing to a FastMACE user."""

    category: type[Warning]
    message: str
    why: str
    module: str = ""


NOISE: tuple[Noise, ...] = (
    Noise(
        FutureWarning,
        _JIT_DEPRECATED,
        "e3nn and mace-torch script their modules, and torch's deepcopy and unpickling of "
        "scripted modules go through torch.jit.save/load: deprecations addressed to those "
        "libraries (torch 2.12 and later).",
    ),
    Noise(
        DeprecationWarning,
        _JIT_DEPRECATED,
        "The same deprecations as torch 2.11 words them (seen on the H200 machine, raised "
        "while mace-torch is imported).",
    ),
    Noise(
        UserWarning,
        r"Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected",
        "mace-torch sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD when imported (contained() removes "
        "it again), and e3nn's load of its own constants right after trips over it.",
    ),
    Noise(
        UserWarning,
        r"The TorchScript type system doesn't support instance-level annotations on empty "
        r"non-base types",
        "e3nn scripts the torch.fx modules it generates (e3nn.util.codegen) whenever mace-torch "
        "builds a layer (templates, backend conversion); torch's checker then warns about "
        "torch.fx.GraphModule's own __init__, 14 times for MP-0 medium.",
    ),
    Noise(
        UserWarning,
        r"To copy construct from a tensor, it is recommended",
        "mace-torch's backend converters build the new model from the old one's config, whose "
        "atomic_numbers is a tensor that MACE.__init__ passes to torch.tensor; only that line "
        "of mace-torch is silenced (a user's own copy construction still warns).",
        module=r"mace\.modules\.models$",
    ),
    Noise(
        UserWarning,
        r"cuequivariance_ops_torch is not available\. Falling back to naive implementation",
        "Raised once per layer when a model is converted to cuEquivariance on the CPU; the plan "
        "and the run report already say 'cuEquivariance's PyTorch fallback (CPU)', and on a GPU "
        "without the CUDA kernels FastMACE reports the cueq backend unavailable instead.",
        module=r"cuequivariance_torch\.",
    ),
)


@contextlib.contextmanager
def library_noise_silenced() -> Iterator[None]:
    """Within the block, the warnings of :data:`NOISE` are not shown; every other warning is
    shown when the block ends, and the filters are put back as they were."""
    with warnings_silenced(NOISE):
        yield


@contextlib.contextmanager
def warnings_silenced(noises: tuple[Noise, ...]) -> Iterator[None]:
    """Within the block, warnings matching ``noises`` are not shown; every other warning is
    shown (once per place) when the block ends, and the filters are put back as they were.

    The block's warnings are recorded rather than only filtered: a library that sets its own
    filters while it runs (``simplefilter("always")`` puts itself ahead of ours) would
    otherwise print noise anyway, as happened on the GPU machine.
    """
    with warnings.catch_warnings(record=True) as caught:
        for noise in noises:
            warnings.filterwarnings(
                "ignore", message=noise.message, category=noise.category, module=noise.module
            )
        yield
    shown = set()
    for message in caught:
        place = (message.category, str(message.message), message.filename, message.lineno)
        if place in shown or is_noise(message, noises):
            continue
        shown.add(place)
        warnings.warn_explicit(
            message.message, message.category, message.filename, message.lineno,
            source=message.source,
        )  # fmt: skip


def is_noise(message: warnings.WarningMessage, noises: tuple[Noise, ...] = NOISE) -> bool:
    """Whether a recorded warning is one of ``noises``."""
    text = str(message.message)
    # The file's path as dots (".../site-packages/mace/modules/models.py" ->
    # "...site-packages.mace.modules.models"): a noise's module must match a whole tail of it.
    dotted = ".".join(Path(message.filename).with_suffix("").parts)
    return any(
        issubclass(message.category, noise.category)
        and re.match(noise.message, text, re.IGNORECASE) is not None
        and (not noise.module or re.search(rf"(?:^|\.){noise.module}", dotted) is not None)
        for noise in noises
    )
