"""Describe the build environment to CMake: OEq's sources and flags, each torch, CUDA, pybind11.

CMake runs this with the build's Python and includes the file it writes. The compile flags
are those of OpenEquivariance 0.7.0's own JIT build (``openequivariance/_torch/extlib``):
``-O3 -DCUDA_BACKEND``, torch's extension defines, C++20, OEq's ``extension/backend`` and
pybind11's headers first, then torch's. CUDA headers and libraries come from the CUDA 13
wheels torch depends on (``site-packages/nvidia/cu13``), not from a toolkit.

One library is built per torch minor version. The torches are the build environment's own
and every tree named in ``FASTMACE_OEQ_TORCH_TREES`` (``os.pathsep``-separated directories,
each a ``torch`` package or its parent, as ``tools/release/oeq_wheels/fetch_torch.py``
unpacks them: headers and libraries only). Nothing here imports torch, so a tree needs none
of torch's Python dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import sysconfig
from importlib import metadata, util
from pathlib import Path

OEQ_SOURCES = ("libtorch_tp_jit.cpp", "json11/json11.cpp")
EXTENSION_NAME = "libtorch_tp_jit"
TORCH_TREES_VARIABLE = "FASTMACE_OEQ_TORCH_TREES"
TORCH_LIBRARIES = ("c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python")
CUDA_MAJOR = "13"


def package_dir(name: str) -> Path:
    spec = util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"build_inputs: {name} is not installed in the build environment")
    return Path(next(iter(spec.submodule_search_locations)))


def torch_dirs() -> list[Path]:
    """The build environment's torch, then each tree of FASTMACE_OEQ_TORCH_TREES."""
    found = [package_dir("torch")]
    for entry in filter(None, os.environ.get(TORCH_TREES_VARIABLE, "").split(os.pathsep)):
        tree = Path(entry)
        tree = tree / "torch" if (tree / "torch" / "version.py").is_file() else tree
        if not (tree / "version.py").is_file():
            sys.exit(f"build_inputs: {entry} ({TORCH_TREES_VARIABLE}) holds no torch/version.py")
        found.append(tree)
    return found


def _version_field(text: str, name: str) -> str | None:
    match = re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def uses_cxx11_abi(torch_dir: Path) -> bool:
    """Whether torch was built with the C++11 ABI: its libc10 then names ``std::__cxx11``."""
    return b"__cxx11" in (torch_dir / "lib" / "libc10.so").read_bytes()


def torch_facts(torch_dir: Path) -> dict:
    """One torch's version, CUDA, ABI, headers and libraries, read from its files."""
    text = (torch_dir / "version.py").read_text(encoding="utf-8")
    version, cuda = _version_field(text, "__version__"), _version_field(text, "cuda")
    if version is None:
        sys.exit(f"build_inputs: {torch_dir}/version.py has no __version__")
    if cuda is None or cuda.split(".")[0] != CUDA_MAJOR:
        sys.exit(
            f"build_inputs: torch {version} in {torch_dir} is built for CUDA {cuda}; this "
            f"library links the CUDA {CUDA_MAJOR} wheels (use a +cu13x torch)"
        )
    minor = ".".join(version.split("+")[0].split(".")[:2])
    include = torch_dir / "include"
    return {
        "torch": version,
        "torch_minor": minor,
        "cuda": cuda,
        "cxx11_abi": uses_cxx11_abi(torch_dir),
        "directory": f"torch-{minor}",
        "includes": [str(include), str(include / "torch" / "csrc" / "api" / "include")],
        "libraries": [str(torch_dir / "lib" / f"lib{name}.so") for name in TORCH_LIBRARIES],
    }


def torches() -> list[dict]:
    """Facts for every torch to build against, by minor version; one tree per minor."""
    described = [torch_facts(directory) for directory in torch_dirs()]
    minors = [facts["torch_minor"] for facts in described]
    repeated = sorted({minor for minor in minors if minors.count(minor) > 1})
    if repeated:
        sys.exit(f"build_inputs: more than one torch {', '.join(repeated)}; one per minor")
    return sorted(described, key=lambda facts: tuple(map(int, facts["torch_minor"].split("."))))


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

    oeq_extension = package_dir("openequivariance") / "extension"
    cuda = cuda_wheel_dirs()
    # Each header's include directory, in the order found (cuda.h first, then crt's).
    cuda_includes: list[str] = []
    for header in ("cuda.h", "nvrtc.h", "crt/host_config.h"):
        directory = str(find_in(cuda, f"include/{header}")).removesuffix(header).rstrip("/")
        if directory not in cuda_includes:
            cuda_includes.append(directory)
    return {
        "openequivariance": metadata.version("openequivariance"),
        "pybind11": pybind11.__version__,
        "python_tag": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "sources": [str(oeq_extension / source) for source in OEQ_SOURCES],
        "user_includes": [str(oeq_extension / "backend"), pybind11.get_include()],
        # After each torch's own headers.
        "system_includes": [*cuda_includes, sysconfig.get_path("include", scheme="posix_prefix")],
        "definitions": [
            f"TORCH_EXTENSION_NAME={EXTENSION_NAME}",
            "TORCH_API_INCLUDE_EXTENSION_H",
            "CUDA_BACKEND",
        ],
        "cuda_libraries": [
            str(find_in(cuda, f"lib/lib{name}.so.13")) for name in ("cudart", "nvrtc", "cublas")
        ],
        "oeq_licence": str(licence_file("openequivariance")),
        "torches": torches(),
    }


def cmake_list(values: list[str]) -> str:
    return ";".join(value.replace(";", r"\;") for value in values)


def cmake_lines(facts: dict) -> list[str]:
    lines = [
        f'set(OEQ_SOURCES "{cmake_list(facts["sources"])}")',
        f'set(OEQ_USER_INCLUDES "{cmake_list(facts["user_includes"])}")',
        f'set(OEQ_SYSTEM_INCLUDES "{cmake_list(facts["system_includes"])}")',
        f'set(OEQ_DEFINITIONS "{cmake_list(facts["definitions"])}")',
        f'set(OEQ_CUDA_LIBRARIES "{cmake_list(facts["cuda_libraries"])}")',
        f'set(OEQ_LICENCE "{facts["oeq_licence"]}")',
    ]
    minors = [torch["torch_minor"] for torch in facts["torches"]]
    lines.append(f'set(OEQ_TORCH_MINORS "{cmake_list(minors)}")')
    for torch in facts["torches"]:
        suffix = torch["torch_minor"].replace(".", "_")
        lines += [
            f'set(OEQ_TORCH_INCLUDES_{suffix} "{cmake_list(torch["includes"])}")',
            f'set(OEQ_TORCH_LIBRARIES_{suffix} "{cmake_list(torch["libraries"])}")',
            f"set(OEQ_TORCH_CXX11_ABI_{suffix} {int(torch['cxx11_abi'])})",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cmake", type=Path, required=True, help="CMake file to write")
    parser.add_argument("--json", type=Path, required=True, help="the same facts as JSON")
    args = parser.parse_args()
    facts = describe()
    args.json.write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    args.cmake.write_text("\n".join(cmake_lines(facts)) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
