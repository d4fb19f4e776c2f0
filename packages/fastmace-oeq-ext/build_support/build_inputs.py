"""Describe the build environment to CMake: OEq's sources and flags, torch, CUDA, pybind11.

CMake runs this with the build's Python and includes the file it writes. The compile flags
are those of OpenEquivariance 0.7.0's own JIT build (``openequivariance/_torch/extlib``):
``-O3 -DCUDA_BACKEND``, torch's extension defines, C++20, OEq's ``extension/backend`` and
pybind11's headers first, then torch's. CUDA headers and libraries come from the CUDA 13
wheels torch depends on (``site-packages/nvidia/cu13``), not from a toolkit.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from importlib import metadata, util
from pathlib import Path

OEQ_SOURCES = ("libtorch_tp_jit.cpp", "json11/json11.cpp")
EXTENSION_NAME = "libtorch_tp_jit"


def package_dir(name: str) -> Path:
    spec = util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"build_inputs: {name} is not installed in the build environment")
    return Path(next(iter(spec.submodule_search_locations)))


def cuda_wheel_dirs() -> list[Path]:
    """Every ``nvidia/cu13`` directory: the namespace package may span several site dirs
    (a venv over system packages, or headers installed separately from libraries)."""
    spec = util.find_spec("nvidia")
    locations = (spec.submodule_search_locations or []) if spec else []
    found = [Path(location, "cu13") for location in locations]
    found = [path for path in found if (path / "include").is_dir() or (path / "lib").is_dir()]
    if not found:
        sys.exit("build_inputs: the CUDA 13 wheels (site-packages/nvidia/cu13) are not installed")
    return found


def find_in(directories: list[Path], relative: str) -> Path:
    for directory in directories:
        if (directory / relative).exists():
            return directory / relative
    sys.exit(
        f"build_inputs: {relative} is in none of {', '.join(map(str, directories))}; install "
        "the CUDA 13 wheels torch uses plus nvidia-cuda-crt and nvidia-cuda-cccl"
    )


def licence_file(distribution: str) -> Path:
    files = metadata.distribution(distribution).files or []
    for file in files:
        if file.name in {"LICENSE", "LICENSE.txt", "LICENSE.md"}:
            return Path(file.locate())
    sys.exit(f"build_inputs: {distribution}'s licence file is not installed")


def describe() -> dict:
    import pybind11
    import torch
    from torch.utils.cpp_extension import include_paths

    oeq_extension = package_dir("openequivariance") / "extension"
    cuda = cuda_wheel_dirs()
    # Each header's include directory, in the order found (cuda.h first, then crt's).
    cuda_includes: list[str] = []
    for header in ("cuda.h", "nvrtc.h", "crt/host_config.h"):
        directory = str(find_in(cuda, f"include/{header}")).removesuffix(header).rstrip("/")
        if directory not in cuda_includes:
            cuda_includes.append(directory)
    torch_lib = Path(torch.__file__).parent / "lib"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "openequivariance": metadata.version("openequivariance"),
        "pybind11": pybind11.__version__,
        "python_tag": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "sources": [str(oeq_extension / source) for source in OEQ_SOURCES],
        "user_includes": [str(oeq_extension / "backend"), pybind11.get_include()],
        "system_includes": [
            *include_paths("cpu"),
            *cuda_includes,
            sysconfig.get_path("include", scheme="posix_prefix"),
        ],
        "definitions": [
            f"TORCH_EXTENSION_NAME={EXTENSION_NAME}",
            "TORCH_API_INCLUDE_EXTENSION_H",
            "CUDA_BACKEND",
        ],
        "torch_libraries": [
            str(torch_lib / f"lib{name}.so")
            for name in ("c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python")
        ],
        "cuda_libraries": [
            str(find_in(cuda, f"lib/lib{name}.so.13")) for name in ("cudart", "nvrtc", "cublas")
        ],
        "oeq_licence": str(licence_file("openequivariance")),
    }


def cmake_list(values: list[str]) -> str:
    return ";".join(value.replace(";", r"\;") for value in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cmake", type=Path, required=True, help="CMake file to write")
    parser.add_argument("--json", type=Path, required=True, help="the same facts as JSON")
    args = parser.parse_args()
    facts = describe()
    args.json.write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    lines = [
        f'set(OEQ_SOURCES "{cmake_list(facts["sources"])}")',
        f'set(OEQ_USER_INCLUDES "{cmake_list(facts["user_includes"])}")',
        f'set(OEQ_SYSTEM_INCLUDES "{cmake_list(facts["system_includes"])}")',
        f'set(OEQ_DEFINITIONS "{cmake_list(facts["definitions"])}")',
        f'set(OEQ_TORCH_LIBRARIES "{cmake_list(facts["torch_libraries"])}")',
        f'set(OEQ_CUDA_LIBRARIES "{cmake_list(facts["cuda_libraries"])}")',
        f'set(OEQ_LICENCE "{facts["oeq_licence"]}")',
    ]
    args.cmake.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
