#!/usr/bin/env bash
# A performance session on the GPU machine, in one command: the step profile of this checkout,
# the benchmark of a baseline source tree and of this checkout side by side (before/after),
# then the gpu-marked engine and neighbour-list tests.
#
#   . .gpu/setup.sh && bash tools/validation/perf_gpu.sh BASELINE_DIR ONLY [BUDGET_S]
#
# BASELINE_DIR holds packages/fastmace/src and benchmarks/ of the commit to compare with (made
# with `git archive COMMIT packages/fastmace/src benchmarks | tar -x -C BASELINE_DIR`); ONLY is
# md_speed.py's --only filter. Writes $OUT/{profile,before,after}/ and $OUT/gpu_tests.txt.
set -u
OUT=${OUT:-/tmp/perf-gpu}
mkdir -p "$OUT"
export FASTMACE_CACHE=${FASTMACE_CACHE:-/tmp/fastmace-cache}
baseline=$1
only=$2
budget=${3:-150}
site=${PYTHONPATH:-}
here="$PWD/packages/fastmace/src"
PYTHONPATH="$here:$site" timeout 170 python3 benchmarks/profile_step.py --atoms 216,13824 \
  --tf32 --out "$OUT/profile" > "$OUT/profile.log" 2>&1
echo "profile: exit $?"
if [ -d "$baseline" ]; then
  PYTHONPATH="$baseline/packages/fastmace/src:$site" python3 "$baseline/benchmarks/md_speed.py" \
    --out "$OUT/before" --budget-s "$budget" --only "$only" > "$OUT/before.log" 2>&1
  echo "before: exit $?"
fi
PYTHONPATH="$here:$site" python3 benchmarks/md_speed.py --out "$OUT/after" --budget-s "$budget" \
  --only "$only" > "$OUT/after.log" 2>&1
echo "after: exit $?"
PYTHONPATH="$here:$site" timeout "${TEST_TIMEOUT_S:-200}" python3 -m pytest -q -m gpu \
  -p no:cacheprovider packages/fastmace/tests/test_engine_gpu.py \
  packages/fastmace/tests/test_neighbours.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests.txt"))"
