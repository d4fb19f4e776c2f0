#!/usr/bin/env bash
# A performance session on the GPU machine, in one command: the gpu-marked engine, list and
# potential tests, the benchmark of a baseline source tree and of this checkout (before/after,
# same machine, same command), and optionally the step profile of this checkout.
#
#   . .gpu/setup.sh && bash tools/validation/perf_gpu.sh BASELINE_DIR BEFORE_ONLY AFTER_ONLY
#
# BASELINE_DIR holds packages/fastmace/src and benchmarks/ of the commit to compare with (made
# with `git archive COMMIT packages/fastmace/src benchmarks | tar -x -C BASELINE_DIR`);
# BEFORE_ONLY and AFTER_ONLY are md_speed.py's --only filters for each side. Budgets (seconds):
# TEST_TIMEOUT_S (150), BEFORE_BUDGET_S (90), AFTER_BUDGET_S (300); PROFILE=1 adds
# benchmarks/profile_step.py at 216 and 13,824 atoms. Writes $OUT/{before,after,profile}/ and
# $OUT/gpu_tests.txt.
set -u
OUT=${OUT:-/tmp/perf-gpu}
mkdir -p "$OUT"
export FASTMACE_CACHE=${FASTMACE_CACHE:-/tmp/fastmace-cache}
baseline=$1
before_only=$2
after_only=$3
site=${PYTHONPATH:-}
here="$PWD/packages/fastmace/src"
PYTHONPATH="$here:$site" timeout "${TEST_TIMEOUT_S:-150}" python3 -m pytest -q -m gpu \
  -p no:cacheprovider packages/fastmace/tests/test_engine_gpu.py \
  packages/fastmace/tests/test_neighbours.py packages/fastmace/tests/test_potential.py \
  packages/fastmace/tests/test_pair_radials.py \
  > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests.txt"))"
if [ -d "$baseline" ]; then
  PYTHONPATH="$baseline/packages/fastmace/src:$site" python3 "$baseline/benchmarks/md_speed.py" \
    --out "$OUT/before" --budget-s "${BEFORE_BUDGET_S:-90}" --only "$before_only" \
    > "$OUT/before.log" 2>&1
  echo "before: exit $?"
fi
PYTHONPATH="$here:$site" python3 benchmarks/md_speed.py --out "$OUT/after" --force-errors \
  --budget-s "${AFTER_BUDGET_S:-300}" --only "$after_only" > "$OUT/after.log" 2>&1
echo "after: exit $?"
if [ "${PROFILE:-0}" = 1 ]; then
  PYTHONPATH="$here:$site" timeout 170 python3 benchmarks/profile_step.py --atoms 216,13824 \
    --out "$OUT/profile" > "$OUT/profile.log" 2>&1
  echo "profile: exit $?"
fi
