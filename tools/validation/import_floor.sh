#!/usr/bin/env bash
# What a warm start pays before FastMACE's own work: each import in a fresh process, twice,
# on the GPU machine (`. .gpu/setup.sh` first). The model phase of a warm `fastmace md` reads
# the kept conversion, which imports mace-torch's model code, e3nn and cuEquivariance; the
# request check imports torch and ASE's readers. Also mace-torch's model code with
# TORCHINDUCTOR_COMPILE_THREADS=1, which stage 117 saw shorten the model phase.
set -u
seconds() {  # seconds LABEL CODE: the wall time of `python3 -c CODE`, twice
  for round in 1 2; do
    local start end
    start=$(date +%s.%N)
    python3 -c "$2" > /dev/null 2>&1
    end=$(date +%s.%N)
    printf '%-44s %6.2f s\n' "$1" "$(echo "$end - $start" | bc)"
  done
}
seconds "python alone" "pass"
seconds "torch" "import torch"
seconds "torch + ase.io" "import torch, ase.io"
seconds "torch + CUDA context" "import torch; torch.zeros(1, device='cuda')"
seconds "cuequivariance_ops_torch" "import cuequivariance_ops_torch"
seconds "cuequivariance_torch" "import cuequivariance_torch"
seconds "e3nn.o3" "import e3nn.o3"
seconds "mace.modules" "import mace.modules"
TORCHINDUCTOR_COMPILE_THREADS=1 seconds "mace.modules, one compile thread" "import mace.modules"
seconds "torch._inductor.compile_fx" "import torch._inductor.compile_fx"
seconds "fastmace.cli" "import fastmace.cli"
