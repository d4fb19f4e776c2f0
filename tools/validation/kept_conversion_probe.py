"""Why a conversion on CUDA is not kept (GPU machine): what converted_cache.write refuses.

    python3 tools/validation/kept_conversion_probe.py

Converts the MP-0-small template on CUDA, then prints the wrapped forwards, whether pickling
succeeds, and every submodule whose outline differs after a round trip.
"""

from __future__ import annotations

import io

import torch

from fastmace.models import converted_cache as kept
from fastmace.models.backends import convert
from fastmace.models.templates import template


def main() -> None:
    module = convert(template("mp0-small", dtype=torch.float32), "cueq", "cuda")
    wrapped = kept.instance_forwards(module)
    print("wrapped:", wrapped, "known:", set(wrapped.values()) <= set(kept._wrappers()))
    buffer = io.BytesIO()
    torch.save({"module": module, "check": {}, "wrapped": wrapped}, buffer)
    print("pickled:", len(buffer.getvalue()), "bytes")
    again = kept._unpickled(buffer.getvalue(), "cuda")["module"]
    before, after = kept._outline(module), kept._outline(again)
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            print("differs:", name)
            print("  before:", str(before.get(name))[:600])
            print("  after: ", str(after.get(name))[:600])


if __name__ == "__main__":
    main()
