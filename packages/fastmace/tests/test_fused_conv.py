"""FastMACE's own interaction convolution (dynamics/fused_conv.py, conv_triton.py).

The coupling is read from each block's own cuEquivariance module and checked against it; the
Triton kernels give the torch formulas' numbers in Triton's interpreter (CPU) and compile for
Hopper; a Potential that convolves with them gives mace-torch's float64 energies, forces and
stresses, on plain and mirrored edges. On a GPU the same comparisons run compiled.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from conftest import CompileForHopper, cueq_template, model_edges, python_report
from helpers.potential_checks import assert_matches_reference, model_of
from helpers.structures import ase_edges, cluster, copper_supercell, triclinic_mixed

from fastmace.dynamics.fused_conv import (
    ConvolutionError,
    FusedConvolution,
    coupling_disagreement,
    coupling_of,
    edge_runs,
    fused_conv,
    fused_conv_backward,
    fused_convolution_model,
    module_disagreement,
)
from fastmace.dynamics.potential import Potential, UnsupportedModelError
from fastmace.dynamics.state import State
from fastmace.dynamics.table_conv import (
    TableLengths,
    TabulatedConvolution,
    table_conv,
    table_conv_backward,
)
from fastmace.models import backends
from fastmace.models.templates import template
from fastmace.provenance import kernel_words

SPECIES = [29, 8, 6, 1]


@functools.cache
def cueq_model(name: str, dtype: torch.dtype, device: str = "cpu") -> torch.nn.Module:
    """The template converted to cuEquivariance, once per test session (float64 on the CPU:
    conftest's, shared with test_edge_chunks.py)."""
    if (dtype, device) == (torch.float64, "cpu"):
        return cueq_template(name)
    return backends.convert(model_of(name, dtype), "cueq", device)


@pytest.mark.parametrize("name", ["tiny", "mp0-medium"])
def test_the_coupling_read_from_a_block_is_what_the_block_computes(name):
    model = cueq_model(name, torch.float64)
    for block in model.interactions:
        coupling = coupling_of(block)
        d1, d2, d3 = coupling.coefficients.shape
        assert coupling.path_of.shape == (d3,)
        radial = block.conv_tp_weights(torch.zeros(1, block.edge_feats_irreps.dim).double())
        assert radial.shape[1] == coupling.paths * coupling.channels
        assert block.edge_attrs_irreps.dim == d2 and block.edge_irreps.dim == d1 * coupling.channels
        assert coupling_disagreement(block, coupling, seed=1) < 1e-13


def test_a_block_in_another_layout_is_refused_with_the_reason():
    """e3nn's own modules order features channel by channel (mul_ir): the check catches it."""
    with pytest.raises(ConvolutionError, match="differ from the block's own convolution"):
        fused_convolution_model(model_of("tiny", torch.float64))
    # A potential that may fall back keeps the blocks' own convolution and says why.
    with pytest.warns(RuntimeWarning, match="the blocks' own convolution runs"):
        potential = Potential(model_of("tiny", torch.float64), SPECIES, fused_convolution=True,
                              fused_convolution_fallback=True)  # fmt: skip
    assert not potential.fused_convolution_used
    assert "differ from the block's own convolution" in potential.fused_convolution_failure


def test_the_module_that_runs_is_checked_against_the_blocks_own():
    """What runs (on CUDA, the kernels) is compared with the block's convolution: right,
    within float64's rounding; with one coefficient 1e-9 off, refused."""
    block = cueq_model("tiny", torch.float64).interactions[1]
    coupling = coupling_of(block)
    cpu = torch.device("cpu")
    ours = FusedConvolution(coupling, torch.float64, cpu, skip=1)
    assert module_disagreement(ours, block) <= 1e-13
    changed = coupling.coefficients.clone()
    i, j, k = torch.nonzero(changed)[0].tolist()
    changed[i, j, k] *= 1 + 1e-9
    wrong = FusedConvolution(dataclasses.replace(coupling, coefficients=changed), torch.float64,
                             cpu, skip=1)  # fmt: skip
    assert module_disagreement(wrong, block) > 1e-12


def test_a_long_range_model_refuses_the_fused_convolution_instead_of_dropping_it():
    with pytest.raises(UnsupportedModelError, match="leave fused_convolution off"):
        Potential(template("polar-tiny", dtype=torch.float32), [1, 8], fused_convolution=True)


@pytest.mark.parametrize("name", ["tiny", "mp0-medium"])
def test_a_potential_on_the_fused_convolution_gives_mace_torchs_results(name):
    model = cueq_model(name, torch.float64)
    structures = [copper_supercell(), triclinic_mixed(), cluster()]
    state = State.from_atoms(structures)
    potential = Potential(model, SPECIES, fused_convolution=True)
    blocks = [block.conv_tp for block in potential.model.interactions]
    assert all(isinstance(block, FusedConvolution) for block in blocks)
    for edges in (ase_edges(state, potential.r_max, 1.5), model_edges(state, potential.r_max)):
        output = potential(state, edges, compute_stress=True)
        # Against the e3nn model mace-torch builds, one structure at a time.
        assert_matches_reference(model_of(name, torch.float64), structures, output, state)


def organic() -> list:
    """MACE-OFF's elements: ethanol alone, and a rattled periodic box of two."""
    from ase.build import molecule

    box = molecule("CH3CH2OH")
    box += molecule("CH3CH2OH")
    box.positions[9:] += [3.2, 0.4, 0.3]
    box.cell, box.pbc = [[8.5, 0.0, 0.0], [0.6, 7.0, 0.0], [0.3, -0.4, 7.4]], True
    box.center()
    box.rattle(0.03, seed=6)
    return [molecule("CH3CH2OH"), box]


# The block types of MH-1 (RealAgnosticResidualNonLinearInteractionBlock, six heads) and of
# MACE-OFF (its own irreps and cut-off, organic elements): both own kernels at once, as the
# CPU's torch formulas, against mace-torch (the kernels themselves: the interpreter tests).
@pytest.mark.parametrize(("name", "head"), [("mh-1", "omat_pbe"), ("off23-medium", None)])
def test_both_own_kernels_on_mh1_and_mace_off_blocks_give_mace_torchs_results(name, head):
    model = cueq_model(name, torch.float64)
    structures = organic() if name.startswith("off") else [copper_supercell(), triclinic_mixed()]
    species = sorted({int(z) for atoms in structures for z in atoms.numbers})
    state = State.from_atoms(structures)
    potential = Potential(model, species, head, fused_convolution=True, product_basis=True)
    assert potential.fused_convolution_used and potential.product_basis_used
    # The start-up line names them (the planner may choose the convolution by itself).
    assert kernel_words(potential) == ["own convolution", "own product basis"]
    output = potential(state, ase_edges(state, potential.r_max, 1.5), compute_stress=True)
    assert_matches_reference(model_of(name, torch.float64), structures, output, state, head)


def test_the_own_kernels_are_checked_again_on_the_runs_first_state():
    """A convolution that passed its check when built but disagrees on the run's first state
    (here: its coefficients changed by 1 % afterwards) is dropped there, with the reason, and
    cuEquivariance's result returned, then and after; without the fallback the run stops."""
    model = cueq_model("tiny", torch.float64)
    state = State.from_atoms([copper_supercell()])
    edges = ase_edges(state, float(model.r_max), 1.5)
    want = Potential(model, SPECIES)(state, edges)
    good = Potential(model, SPECIES, fused_convolution=True, product_basis=True)
    good(state, edges)
    assert good.fused_convolution_used and good.product_basis_used
    assert "own convolution and product basis within" in good.own_kernels_check

    def corrupted(fallback: bool) -> Potential:
        potential = Potential(
            model, SPECIES, fused_convolution=True, fused_convolution_fallback=fallback
        )
        with torch.no_grad():
            potential.model.interactions[0].conv_tp.coefficients.mul_(1.01)
        return potential

    bad = corrupted(fallback=True)
    with pytest.warns(RuntimeWarning, match="first state"):
        first = bad(state, edges)
    assert not bad.fused_convolution_used and "first state" in bad.fused_convolution_failure
    for output in (first, bad(state, edges)):
        torch.testing.assert_close(output.forces, want.forces, rtol=0, atol=1e-12)
    with pytest.raises(ConvolutionError, match="first state"):
        corrupted(fallback=False)(state, edges)


def test_with_radial_tables_the_convolution_reads_them_itself():
    """Tables and the own convolution: each block's table moves into its convolution (the
    weights interpolated where they are used), and the potential gives what tables and the
    convolution give one after the other, on plain and mirrored edges (pairs' lengths)."""
    model = cueq_model("tiny", torch.float64)
    structures = [copper_supercell(), cluster()]
    state = State.from_atoms(structures)
    apart = Potential(model, SPECIES, radial_table=True)
    inside = Potential(model, SPECIES, radial_table=True, fused_convolution=True)
    blocks = list(inside.model.interactions)
    assert all(isinstance(block.conv_tp, TabulatedConvolution) for block in blocks)
    assert all(isinstance(block.conv_tp_weights, TableLengths) for block in blocks)
    for edges in (ase_edges(state, inside.r_max, 1.5), model_edges(state, inside.r_max)):
        want = apart(state, edges, compute_stress=True)
        got = inside(state, edges, compute_stress=True)
        for name in ("energy", "forces", "stress"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-10,
                                       atol=1e-12)  # fmt: skip


POTENTIAL_IN_THE_INTERPRETER = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from helpers.potential_checks import assert_matches_reference, model_of
from helpers.structures import ase_edges, cluster, copper_supercell
from conftest import model_edges
from fastmace.dynamics import kernel_sources
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models import backends
from fastmace.models.load import load

# Small structures, each kind of edges once: the interpreter runs each edge of each program
# in Python (130 edges took 10 s). Plain edges against mace-torch on the tiny template,
# mirrored ones on the demo model; the tables on the demo model's mirrored edges.
demo = load("demo-emt-cu", dtype="float64").module
tiny = model_of("tiny", torch.float64)
for name, reference, species, structures, mirrored in (
    ("tiny", tiny, [29, 8, 6, 1], [cluster()], False),
    ("demo", demo, [29], [copper_supercell((2, 1, 1))[:2]], True),
):
    model = backends.convert(reference, "cueq", "cpu")
    state = State.from_atoms(structures)
    potential = Potential(model, species, fused_convolution=True)
    assert potential.fused_convolution_used, name
    edges = (model_edges(state, potential.r_max) if mirrored
             else ase_edges(state, potential.r_max, 1.5))
    output = potential(state, edges, compute_stress=True)
    assert_matches_reference(reference, structures, output, state)
tables = Potential(model, species, radial_table=True)
both = Potential(model, species, radial_table=True, fused_convolution=True)
want, got = tables(state, edges, compute_stress=True), both(state, edges, compute_stress=True)
for field in ("energy", "forces", "stress"):
    torch.testing.assert_close(getattr(got, field), getattr(want, field), rtol=1e-10, atol=1e-12)
print(json.dumps(kernel_sources.loaded()))
"""


def test_a_potential_with_the_kernels_in_the_interpreter_gives_mace_torchs_results(clean_env):
    """The whole potential with the convolution's kernels (Triton's interpreter on the CPU),
    on plain and mirrored edges, forces and stress included: mace-torch's float64 numbers;
    reading radial tables, the tables' with the convolution apart."""
    tests = str(Path(__file__).parent)
    code = POTENTIAL_IN_THE_INTERPRETER.format(tests=tests)
    loaded = python_report(code, {**clean_env, "TRITON_INTERPRET": "1"})
    # Kernels are generated when they first run, for each block's coupling: the tiny
    # template's two and the demo's (its first block's coupling is the tiny template's).
    assert loaded and all(name.startswith("conv_") and name.endswith("_loaded") for name in loaded)


# The child reads the couplings this process read from the same templates (compare): it need
# not convert MP-0 medium to cuEquivariance again, 40 s of the test's 80 on CI's CPU.
COMPARE = """
import json, torch
from fastmace.dynamics import conv_codegen, conv_triton
from fastmace.dynamics.fused_conv import convolve_backward_reference, convolve_reference
from fastmace.dynamics.table_conv import table_conv_backward_reference, table_conv_reference

report = {{}}
generator = torch.Generator().manual_seed(0)
couplings = torch.load({couplings!r}, weights_only=True)
for name in ("tiny", "mp0-medium"):
    coupling = couplings[name]
    d1, d2, d3 = coupling["coefficients"].shape
    channels, paths = coupling["channels"], int(coupling["path_of"].max()) + 1
    key = conv_codegen.register(coupling["coefficients"], coupling["path_of"])
    # conv_triton.Launch's first fields in order, None: the default.
    for values in {launches!r}[name]:
        defaults = conv_triton.Launch()
        launch = conv_triton.Launch(*[
            getattr(defaults, field) if value is None else value
            for field, value in zip(conv_triton.Launch.__dataclass_fields__, values)
        ])
        for dtype in (torch.float64, torch.float32):
            # Plain rows with no padding atom; pair rows (E/2) with one, as a Potential has.
            for skip, halves in ((0, 1), (1, 2)):
                atoms, edges = 7, 32  # about 5 edges per atom: tails of four
                draw = lambda *shape: torch.randn(shape, generator=generator, dtype=dtype)
                x, y = draw(atoms, d1, channels), draw(edges, d2)
                w, g = draw(edges // halves, paths, channels), draw(atoms, d3, channels)
                index = torch.randint(0, atoms - skip, (2, edges), generator=generator)
                index[:, edges // 2 - 3 : edges // 2] = atoms - 1 if skip else index[:, :3]
                index[:, edges - 3 :] = atoms - 1 if skip else index[:, 3:6]
                x, y, w, g, index = (t.to({device!r}) for t in (x, y, w, g, index))
                t = coupling["coefficients"].to({device!r}, dtype)
                paths_of = coupling["path_of"].to({device!r})
                receiver_runs = conv_triton.runs(index[1], atoms)
                want = [convolve_reference(x, y, w, t, paths_of, index, skip)]
                got = [conv_triton.forward(key, x, y, w, t, index[0], receiver_runs, skip,
                                           launch)]
                want += convolve_backward_reference(g, x, y, w, t, paths_of, index, skip)
                got += conv_triton.backward(key, g, x, y, w, t, index, receiver_runs,
                                            conv_triton.runs(index[0], atoms), skip, launch)
                case = f"{{name}} {{dtype}} {{launch}} skip={{skip}} rows=E/{{halves}}"
                report[case] = [
                    float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, want)
                ]
            # The weights read from a radial table inside the kernels, as a Potential runs them
            # (pair rows, a padding atom); lengths from 0 to past the table's end.
            # In float32, one table per pair of elements (two pairs, pair_table.py): each
            # row's interpolation starts at its pair's first interval.
            intervals, spacing = 8, 0.5
            pairs = 2 if dtype == torch.float32 else 1
            table = draw(pairs * intervals, 4, paths * channels).to({device!r})
            inverse = torch.tensor(1 / spacing, dtype=dtype, device={device!r})
            lengths = torch.rand(edges // 2, generator=generator, dtype=torch.float64)
            lengths = (lengths * intervals * spacing * 1.1).to({device!r}, dtype)
            start = None
            if pairs > 1:
                start = torch.randint(0, pairs, (edges // 2,), generator=generator) * intervals
                start = start.to({device!r})
            inputs = (lengths, table, inverse, t)
            tail = (start, intervals)
            want = [table_conv_reference(x, y, *inputs, paths_of, index, skip, *tail)]
            want += table_conv_backward_reference(g, x, y, *inputs, paths_of, index, skip, *tail)
            got = [conv_triton.forward_from_table(key, x, y, *inputs, index[0], receiver_runs,
                                                  skip, launch, *tail)]
            *grads, per_edge = conv_triton.backward_from_table(
                key, g, x, y, *inputs, index, receiver_runs, conv_triton.runs(index[0], atoms),
                skip, launch, *tail,
            )
            got += [*grads, per_edge.view(2, -1).sum(0)]
            report[f"{{name}} {{dtype}} {{launch}} table"] = [
                float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, want)
            ]
print(json.dumps(report))
"""


COUPLED = ("tiny", "mp0-medium")  # each one's second block, whose coupling the child reads


# Launches per coupling, conv_triton.Launch's fields (threads, step, registers, prefetch,
# warps), None: the default. On the GPU: the default (one warp, two channels a thread, MP-0
# medium's 128 channels in two tiles per atom), all channels in one program of four warps
# taking four edges at a time, with a tail and the next edges' indices loaded ahead, one
# channel a thread prefetching, and one channel a thread within 64 registers (MP-0 medium's
# second block then spills to local memory). The interpreter pays for every program and every
# loop step (one launch of the tiny coupling in four-channel tiles, one edge a step: 38 s on
# one core), so the launches there are chosen for what they cover at the least cost: the tiny
# coupling in four-channel tiles taking four edges a step with the next ones prefetched, and
# in one tile one edge a step; MP-0 medium's long coupling in one tile, four edges a step (the
# same generated code for any tile width; the interpreter has no registers or warps).
GPU_LAUNCHES = {
    name: ((None, None, None, None), (128, 4, None, True, None), (32, 1, None, True, None),
           (32, 1, 64, False, None))
    for name in ("tiny", "mp0-medium")
}  # fmt: skip
INTERPRETER_LAUNCHES = {
    "tiny": ((4, 4, None, True), (8, 1, None, False)),
    "mp0-medium": ((128, 4, None, False),),
}


def compare(
    env: dict[str, str], device: str, directory: Path, launches: dict[str, tuple]
) -> dict[str, list[float]]:
    couplings = {}
    for name in COUPLED:
        coupling = coupling_of(cueq_model(name, torch.float64).interactions[1])
        couplings[name] = {"coefficients": coupling.coefficients, "path_of": coupling.path_of,
                           "channels": coupling.channels}  # fmt: skip
    path = directory / "couplings.pt"
    torch.save(couplings, path)
    code = COMPARE.format(device=device, couplings=str(path), launches=launches)
    return python_report(code, env)


def assert_kernels_agree(report: dict[str, list[float]], launches: dict[str, tuple]) -> None:
    # Per coupling and launch, 2 dtypes x (2 kinds of rows + the table).
    assert len(report) == 6 * sum(len(each) for each in launches.values())
    for case, errors in report.items():
        rounding = 1e-5 if "float32" in case else 1e-13  # summation order
        assert len(errors) == 4 and all(error <= rounding for error in errors), (case, errors)


def test_the_kernels_match_the_torch_formulas_in_the_interpreter(clean_env, tmp_path):
    interpreted = {**clean_env, "TRITON_INTERPRET": "1"}
    assert_kernels_agree(
        compare(interpreted, "cpu", tmp_path, INTERPRETER_LAUNCHES), INTERPRETER_LAUNCHES
    )


def test_the_custom_ops_keep_their_fakes_promises():
    """torch.library.opcheck on both convolution ops (the torch formulas on the CPU): schema,
    autograd and fake tensors, strides included. A compiled graph lays out its buffers from
    the fakes: the formulas' dL/dY came out transposed, and compiled runs on the CPU failed
    (torch.compile) or differed by 4e-3 eV/Å (a package compiled ahead of time)."""
    generator = torch.Generator().manual_seed(5)
    coupling = coupling_of(cueq_model("tiny", torch.float64).interactions[1])
    d1, d2, d3 = coupling.coefficients.shape
    atoms, edges, channels = 5, 14, coupling.channels
    features = torch.randn((atoms, d1, channels), generator=generator, dtype=torch.float64)
    harmonics = torch.randn((edges, d2), generator=generator, dtype=torch.float64)
    weights = torch.randn((edges // 2, coupling.paths, channels), generator=generator,
                          dtype=torch.float64)  # fmt: skip
    edge_index = torch.randint(0, atoms - 1, (2, edges), generator=generator)
    runs = edge_runs(edge_index, features)
    common = (coupling.coefficients, coupling.path_of, edge_index, *runs, 1, "opcheck")
    for tensor in (features, harmonics, weights):
        tensor.requires_grad_(True)
    grad = torch.randn((atoms, d3, channels), generator=generator, dtype=torch.float64)
    torch.library.opcheck(fused_conv, (features, harmonics, weights, *common))
    # The backward ops are not differentiable (forces need one order): checked without grad.
    plain = [tensor.detach() for tensor in (features, harmonics, weights)]
    torch.library.opcheck(fused_conv_backward, (grad, *plain, *common))
    lengths = torch.rand(edges // 2, generator=generator, dtype=torch.float64).requires_grad_()
    table = torch.randn((6, 4, coupling.paths * channels), generator=generator,
                        dtype=torch.float64)  # fmt: skip
    spacing = torch.tensor(2.0, dtype=torch.float64)
    inputs = (features, harmonics, lengths, table, spacing, *common)
    torch.library.opcheck(table_conv, inputs)
    plain = [tensor.detach() for tensor in inputs[:3]]
    torch.library.opcheck(table_conv_backward, (grad, *plain, *inputs[3:]))
    # Tables per pair of elements: the six rows as two of three intervals, a start per edge.
    start = torch.randint(0, 2, (edges // 2,), generator=generator) * 3
    paired = (*inputs, start, 3)
    torch.library.opcheck(table_conv, paired)
    torch.library.opcheck(table_conv_backward, (grad, *plain, *paired[3:]))


@pytest.mark.parametrize(
    "launch",
    [
        {},
        {"step": 4, "registers": 96, "prefetch": True},
        {"threads": 32, "step": 1, "warps": None},
    ],
    ids=["default", "other", "one-channel-a-thread"],
)
def test_the_kernels_compile_for_hopper(monkeypatch, launch):
    """Triton's whole pipeline down to an sm_90 cubin for MP-0 medium's second block: the
    kernels generated for its coupling (float32, coefficients in the code) and the others,
    with the default launch, taking four edges per iteration within 96 registers a thread
    (ptxas's .maxnreg) loading the next four edges' indices ahead, and one channel a thread."""
    from fastmace.dynamics import conv_codegen, kernel_sources
    from fastmace.dynamics import conv_triton as kernels

    # The float64 conversion the other tests use (converting MP-0 medium again in float32 took
    # 37 s): the kernels compile for the coefficients' shapes and the argument dtypes, and the
    # arguments are float32 here.
    coupling = coupling_of(cueq_model("mp0-medium", torch.float64).interactions[1])
    key = conv_codegen.register(coupling.coefficients, coupling.path_of)
    generated = conv_codegen.kernels(key, literal=True)
    compiled: list[str] = []
    names = [(generated, "_forward"), (generated, "_backward"), (kernels, "_sum_by_sender"),
             (kernels, "_zero_skipped_edges"), (generated, "_forward_table"),
             (generated, "_backward_table")]  # fmt: skip
    for module, name in names:
        monkeypatch.setattr(module, name, CompileForHopper(getattr(module, name), compiled))
    d1, d2, d3 = coupling.coefficients.shape
    c, p = coupling.channels, coupling.paths
    atoms, edges = 5, 8
    x, y, w = torch.zeros(atoms, d1, c), torch.zeros(edges, d2), torch.zeros(edges, p, c)
    t = coupling.coefficients.float()
    index = torch.zeros(2, edges, dtype=torch.int64)
    runs = kernels.runs(index[1], atoms)
    chosen = kernels.Launch(**launch)
    try:
        kernels.forward(key, x, y, w, t, index[0], runs, 1, chosen)
        kernels.backward(key, torch.zeros(atoms, d3, c), x, y, w, t, index, runs, runs, 1, chosen)
        # The table kernels with a table per pair of elements (the start rows' branch).
        lengths, table = torch.zeros(edges), torch.zeros(2 * 4, 4, p * c)
        table_inputs = (lengths, table, torch.tensor(1.0), t)
        start, steps = torch.zeros(edges, dtype=torch.int64), {"launch": chosen, "intervals": 4}
        kernels.forward_from_table(key, x, y, *table_inputs, index[0], runs, 1, start=start,
                                   **steps)  # fmt: skip
        kernels.backward_from_table(key, torch.zeros(atoms, d3, c), x, y, *table_inputs, index,
                                    runs, runs, 1, start=start, **steps)  # fmt: skip
    finally:
        kernel_sources.forget(conv_codegen.module_name(key, literal=True))  # not kernels now
    assert compiled == ["_forward", "_backward", "_sum_by_sender", "_zero_skipped_edges",
                        "_forward_table", "_backward_table", "_sum_by_sender",
                        "_zero_skipped_edges"]  # fmt: skip


def test_the_generated_kernels_hold_only_the_couplings_nonzero_entries():
    """MP-0 medium's second block couples 4 x 16 inputs to 40 outputs through 86 of T's 2,560
    entries: each appears once in the forward (in m_ik) and twice in the backward (m_ik and
    dL/dY), and nothing else of T does."""
    from fastmace.dynamics import conv_codegen

    coupling = coupling_of(cueq_model("mp0-medium", torch.float64).interactions[1])
    entries = conv_codegen.coupling_entries(coupling.coefficients)
    nonzero = int((coupling.coefficients != 0).sum())
    assert len(entries) == nonzero < coupling.coefficients.numel() // 20
    source = conv_codegen.kernel_source(coupling.coefficients, coupling.path_of)
    # Four kernels: each direction reading the weights, then each reading the radial table.
    _, *kernels = source.split("@triton.jit")
    names = [kernel.split("(")[0].split("def ")[1] for kernel in kernels]
    assert names == ["_forward", "_backward", "_forward_table", "_backward_table"]
    for kernel, uses in zip(kernels, (1, 2, 1, 2), strict=True):
        for entry in entries:
            name = f"t{entry.i}_{entry.j}_{entry.k}"
            assert kernel.count(f"{name} * ") == uses, name
        assert kernel.count("tl.load(coefficients + ") == len(entries)  # float64: read once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_kernels_and_the_potential_agree(clean_env, tmp_path):
    assert_kernels_agree(compare(clean_env, "cuda", tmp_path, GPU_LAUNCHES), GPU_LAUNCHES)
    model = cueq_model("mp0-medium", torch.float64, "cuda")
    structures = [copper_supercell(), triclinic_mixed(), cluster()]
    state = State.from_atoms(structures, device="cuda")
    potential = Potential(model, SPECIES, fused_convolution=True)
    output = potential(state, model_edges(state, potential.r_max), compute_stress=True)
    on_host = dataclasses.replace(
        output, energy=output.energy.cpu(), forces=output.forces.cpu(), stress=output.stress.cpu()
    )
    assert_matches_reference(
        model_of("mp0-medium", torch.float64), structures, on_host, State.from_atoms(structures)
    )


@pytest.mark.parametrize(
    ("components", "channels", "tiles", "width", "step"),
    [
        (1, 128, 2, 64, 2),
        (4, 128, 2, 64, 1),
        (4, 96, 3, 32, 1),
        (4, 192, 3, 64, 1),
        (1, 8, 1, 8, 2),
    ],
)
def test_the_default_launch_tiles_the_channels_and_steps_by_block(
    components, channels, tiles, width, step
):
    """One warp takes 64 channels (two a thread) where they divide the atom's channels, else
    32 (96 channels: three programs, none half idle); two edges a step where the senders'
    features have one component (a first block), else one."""
    from fastmace.dynamics import conv_codegen
    from fastmace.dynamics import conv_triton as kernels

    coefficients = torch.zeros(components, 4, 2, dtype=torch.float64)
    coefficients[0, 0, 0] = 1.0
    key = conv_codegen.register(coefficients, torch.tensor([0, 1]))
    features = torch.zeros(3, components, channels)
    _, found_tiles, options = kernels._launch(key, features, kernels.Launch())
    assert (found_tiles, options["CHANNELS"], options["STEP"]) == (tiles, width, step)
    assert options["num_warps"] == 1 and not options["PREFETCH"]
