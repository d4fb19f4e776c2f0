"""The GPU's name without starting CUDA, so that a plan's variables still take effect."""

from __future__ import annotations

import pytest
import torch
from conftest import python_report

from fastmace.runtime.gpu_name import one_name, visible_gpu_name, visible_selectors


@pytest.mark.parametrize(
    ("value", "selectors"),
    [
        (None, None),
        ("", []),
        ("0", [0]),
        ("1,0", [1, 0]),
        (" 2 , 3 ", [2, 3]),
        ("GPU-8a7b", ["GPU-8a7b"]),
        ("0,GPU-8a7b", [0, "GPU-8a7b"]),
        ("0,x,1", [0]),  # CUDA stops at the first entry it cannot read
        ("-1", []),
        ("MIG-5c1d", None),  # a MIG instance is not named after its GPU
    ],
)
def test_visible_devices_are_read_as_cuda_reads_them(value, selectors):
    assert visible_selectors(value) == selectors


def test_a_name_is_given_only_when_every_device_shares_it():
    assert one_name(["NVIDIA H200", "NVIDIA H200"]) == "NVIDIA H200"
    assert one_name(["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]) is None
    assert one_name([]) is None


def test_a_mig_instance_gets_no_name_from_the_library():
    assert visible_gpu_name({"CUDA_VISIBLE_DEVICES": "MIG-5c1d"}) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_planning_leaves_cuda_unstarted_so_the_allocator_setting_takes_effect(clean_env):
    report = python_report(
        "import json, torch\n"
        "from fastmace.machine import probe_availabilities\n"
        "from fastmace.runtime.environment import configure_allocator\n"
        "found = probe_availabilities()\n"
        "started = torch.cuda.is_initialized()\n"
        "configure_allocator(True)\n"
        "x = torch.ones(1 << 20, device='cuda')\n"
        "segments = torch.cuda.memory._snapshot()['segments']\n"
        "print(json.dumps({'started': started, 'name': found.gpu_name,\n"
        "    'torch_name': torch.cuda.get_device_name(0),\n"
        "    'expandable': [s.get('is_expandable') for s in segments]}))\n",
        clean_env,
    )
    assert report["started"] is False
    assert report["name"] == report["torch_name"]
    assert report["expandable"] and all(report["expandable"])
