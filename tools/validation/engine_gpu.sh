#!/usr/bin/env bash
# The MD engine on the GPU machine: the gpu-marked tests, then the side-by-side benchmark.
#
#   . .gpu/setup.sh && bash tools/validation/engine_gpu.sh [TESTS=1|0] -- BENCHMARK ARGS...
#
# Writes $OUT/gpu_tests.txt and the benchmark's JSON and Markdown (docs/validation/performance.md
# says which arguments each session used).
set -u
OUT=${OUT:-/tmp/engine-gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/packages/fastmace/src:${PYTHONPATH:-}"
export FASTMACE_CACHE=${FASTMACE_CACHE:-/tmp/fastmace-cache}
run_tests=${1:-1}
shift || true
[ "${1:-}" = "--" ] && shift
if [ "$run_tests" = 1 ]; then
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
    packages/fastmace/tests/test_engine_gpu.py packages/fastmace/tests/test_neighbours.py \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests.txt"))"
fi
python3 benchmarks/md_speed.py --out "$OUT" "$@"
