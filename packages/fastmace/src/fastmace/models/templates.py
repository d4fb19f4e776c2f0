"""Random-weight mace-torch models with the shapes of released foundation models.

Tests and benchmarks use these instead of the real checkpoints: the cost of a MACE model
depends on its shapes (irreps, ell, correlation, elements, cut-off), not on its weights, and a
template needs no download. The same name and seed always give the same weights.
Shapes follow docs/models.md (from the published architectures).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fastmace.models.checkpoint import contained, import_mace
from fastmace.models.label_table import UnknownLabelError

_OFF_ELEMENTS = (1, 6, 7, 8, 9, 15, 16, 17, 35, 53)  # H C N O F P S Cl Br I
_MH1_HEADS = (
    "omat_pbe", "mp_pbe_refit_add", "matpes_r2scan", "oc20_usemppbe", "spice_wB97M", "omol",
)  # fmt: skip


@dataclass(frozen=True)
class TemplateShape:
    """The architecture of a released model, as far as its cost is concerned."""

    hidden_irreps: str
    interaction: str
    r_max: float = 6.0
    num_bessel: int = 10
    max_ell: int = 3
    correlation: int = 3
    num_interactions: int = 2
    atomic_numbers: tuple[int, ...] = tuple(range(1, 90))
    edge_irreps: str | None = None
    heads: tuple[str, ...] = ("Default",)
    radial_mlp: tuple[int, ...] = (64, 64, 64)
    extra: dict = field(default_factory=dict)
    # "ScaleShiftMACE", or "PolarMACE" (MACE-POLAR-1's class; needs graph-longrange).
    model_type: str = "ScaleShiftMACE"


_TINY = TemplateShape(
    "8x0e+8x1o",
    "RealAgnosticResidualInteractionBlock",
    r_max=4.0,
    num_bessel=4,
    max_ell=2,
    correlation=2,
    atomic_numbers=(1, 6, 8, 29),
    radial_mlp=(8, 8),
)

TEMPLATES: dict[str, TemplateShape] = {
    "mp0-small": TemplateShape("128x0e", "RealAgnosticResidualInteractionBlock"),
    "mp0-medium": TemplateShape("128x0e+128x1o", "RealAgnosticResidualInteractionBlock"),
    "mp0-large": TemplateShape("128x0e+128x1o+128x2e", "RealAgnosticResidualInteractionBlock"),
    "mh-1": TemplateShape(
        "512x0e+512x1o",
        "RealAgnosticResidualNonLinearInteractionBlock",
        edge_irreps="128x0e+128x1o",
        heads=_MH1_HEADS,
    ),
    "off23-medium": TemplateShape(
        "128x0e+128x1o",
        "RealAgnosticResidualInteractionBlock",
        r_max=5.0,
        atomic_numbers=_OFF_ELEMENTS,
    ),
    # Not a released shape: the smallest sensible MACE, for fast tests.
    "tiny": _TINY,
    # Not a released shape: the tiny one as a PolarMACE (MACE-POLAR-1's class) for fast tests,
    # with every part of its long-range model switched on: atomic charges and dipoles
    # (multipoles to l=1), field features to l=1 at two widths, two self-consistent field
    # updates and the local electron energy.
    "polar-tiny": replace(
        _TINY,
        model_type="PolarMACE",
        extra={
            "atomic_multipoles_max_l": 1,
            "atomic_multipoles_smearing_width": 1.0,
            "field_feature_max_l": 1,
            "field_feature_widths": [1.0, 2.0],
            "num_recursion_steps": 2,
            "add_local_electron_energy": True,
        },
    ),
}


def template(
    name: str, seed: int = 0, dtype: torch.dtype = torch.float64, avg_num_neighbors: float = 30.0
) -> torch.nn.Module:
    """A ``ScaleShiftMACE`` (or, for polar templates, a ``PolarMACE``) with the shapes of
    ``name`` and random weights drawn from ``seed``."""
    if name not in TEMPLATES:
        raise UnknownLabelError(
            f"unknown template {name!r}; the templates are: {', '.join(TEMPLATES)}"
        )
    shape = TEMPLATES[name]
    modules = import_mace()
    from e3nn import o3

    with contained(), torch.random.fork_rng(devices=[]):
        torch.set_default_dtype(dtype)  # mace-torch creates its parameters in the default dtype
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        interaction = modules.interaction_classes[shape.interaction]
        # PolarMACE takes ScaleShiftMACE's arguments plus its long-range ones (in ``extra``).
        model_class = getattr(modules, shape.model_type)
        model = model_class(
            r_max=shape.r_max,
            num_bessel=shape.num_bessel,
            num_polynomial_cutoff=5,
            max_ell=shape.max_ell,
            interaction_cls=interaction,
            interaction_cls_first=interaction,
            num_interactions=shape.num_interactions,
            num_elements=len(shape.atomic_numbers),
            hidden_irreps=o3.Irreps(shape.hidden_irreps),
            edge_irreps=o3.Irreps(shape.edge_irreps) if shape.edge_irreps else None,
            MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=rng.uniform(
                -5.0, -1.0, size=(len(shape.heads), len(shape.atomic_numbers))
            ),
            avg_num_neighbors=avg_num_neighbors,
            atomic_numbers=list(shape.atomic_numbers),
            correlation=shape.correlation,
            gate=torch.nn.functional.silu,
            radial_MLP=list(shape.radial_mlp),
            heads=list(shape.heads),
            atomic_inter_scale=[1.0] * len(shape.heads),
            atomic_inter_shift=[0.0] * len(shape.heads),
            **shape.extra,
        )
    return model.eval()
