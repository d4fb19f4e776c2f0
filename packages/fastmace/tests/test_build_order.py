"""A float32 model built first in a process changes nothing in a float64 model built after it
(fastmace.models.checkpoint.clebsch_gordan_in_float64): cuEquivariance caches the coupling
matrices it builds from mace-torch's Clebsch-Gordan coefficients, which mace-torch made in
torch's default dtype. Each order is compared in a fresh process: the test session's own
caches hold whatever earlier tests built."""

from __future__ import annotations

import json

import numpy as np
import torch
from conftest import run_python

from fastmace.models.checkpoint import clebsch_gordan_in_float64, default_dtype, import_mace

TEMPLATE = """
import json, sys
import torch
from fastmace.models.checkpoint import content_hash
from fastmace.models.reference import check_structure, evaluate
from fastmace.models.templates import template
if sys.argv[1] == "float32-first":
    template("tiny", dtype=torch.float32)
model = template("tiny", dtype=torch.float64)
energy = evaluate(model, check_structure((1, 6, 8, 29))).energy
print(json.dumps({"hash": content_hash(model), "energy": energy.hex()}))
"""


def _float64_template(env: dict[str, str], order: str) -> dict[str, str]:
    result = run_python(TEMPLATE.replace("sys.argv[1]", repr(order)), env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_float64_template_is_the_same_after_a_float32_one(clean_env):
    alone = _float64_template(clean_env, "alone")
    after = _float64_template(clean_env, "float32-first")
    assert after == alone  # every weight and buffer, and the energy to the last bit


def test_a_float64_conversion_after_a_float32_one_passes_its_check(clean_env, tmp_path):
    """The demo model's float64 cuEquivariance copy was off by 1e-10 eV (its tolerance is
    3e-12) when a float32 copy had been converted first with a cold cache root."""
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    code = (
        "import fastmace as fm\n"
        "fm.load('demo-emt-cu', backend='cueq', dtype='float32')\n"
        "print(fm.load('demo-emt-cu', backend='cueq', dtype='float64').conversion_check)\n"
    )
    result = run_python(code, clean_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ConversionCheck(backend='cueq', dtype='float64'" in result.stdout


def test_within_the_block_the_coefficients_are_float64_and_after_it_the_librarys_own():
    import_mace()
    from mace.tools.cg import O3_e3nn

    original = vars(O3_e3nn)["clebsch_gordan"]
    vector, tensor = O3_e3nn(l=1, p=-1), O3_e3nn(l=2, p=1)
    with default_dtype(torch.float32):
        rounded = O3_e3nn.clebsch_gordan(vector, vector, tensor)
        with clebsch_gordan_in_float64():
            with clebsch_gordan_in_float64():  # blocks nest
                pass
            exact = O3_e3nn.clebsch_gordan(vector, vector, tensor)
            assert torch.get_default_dtype() == torch.float32
        assert vars(O3_e3nn)["clebsch_gordan"] is original
    with default_dtype(torch.float64):
        expected = O3_e3nn.clebsch_gordan(vector, vector, tensor)
    assert np.array_equal(exact, expected)
    assert np.abs(rounded - expected).max() > 0  # a float32 default without the block
