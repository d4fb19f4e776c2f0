#!/usr/bin/env bash
# Start-up and speed of `fastmace md` (cuEq, MP-0-medium template, float32, rattled NaCl)
# for values of cuEquivariance's CUEQUIVARIANCE_OPS_U1D_ALGOS, which steers how its uniform_1d
# operator plans (and benchmarks) kernels on the first call at a new size.
#   . .gpu/setup.sh && bash tools/validation/cueq_planning.sh $OUT/planning 13824 "1 0 2 3 default"
set -u
out=$1; atoms=${2:-13824}; variants=${3:-"default 1"}; steps=${STEPS:-400}
mkdir -p "$out"
python3 - "$out/nacl.extxyz" "$atoms" <<'PY'
import sys, ase.build, ase.io
n = round((int(sys.argv[2]) / 8) ** (1 / 3))
atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(n)
atoms.rattle(0.05, seed=1)
ase.io.write(sys.argv[1], atoms)
PY
for variant in $variants; do
  if [ "$variant" = default ]; then unset CUEQUIVARIANCE_OPS_U1D_ALGOS
  else export CUEQUIVARIANCE_OPS_U1D_ALGOS=$variant; fi
  start=$(date +%s.%N)
  timeout "${RUN_TIMEOUT_S:-110}" python3 -m fastmace md "$out/nacl.extxyz" \
    --model template:mp0-medium --dtype float32 --backend cueq --steps "$steps" \
    --traj-every 0 --temperature 300 --output "$out/run-$variant" > "$out/run-$variant.log" 2>&1
  rc=$?
  wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  timings=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['timings'])" \
    "$out/run-$variant/metadata.json" 2>/dev/null || echo "-")
  echo "U1D_ALGOS=$variant rc=$rc wall_s=$wall timings=$timings"
  grep -i "error\|speed" "$out/run-$variant.log" | tail -3
done
