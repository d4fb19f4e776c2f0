#!/usr/bin/env bash
# Start-up, compile, D3 cost and the largest cell on the GPU machine, in commands that each fit
# the device's 10-minute limit (every child has its own timeout):
#
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 1   # gpu tests, start-up, D3 cost
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 3   # torch.compile's start-up, cold and warm
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 4   # quiet run, load profile, 157,464 atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 5   # fastmace md with D3, 216 and 1,728 atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 6   # D3's profile and cost; quiet run
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 7   # gpu tests; before/after, .baseline
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 8   # pair tests, profile, start-up
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 9   # pair tests; before/after, .baseline
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 10  # torch.compile, 13,824 and 216
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 11  # D3 at 1,728 atoms only
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 12  # D3 and hybrid, next session
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 13  # hybrid and D3 profiles, 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 14  # replicas' throughput, exchange
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 15  # D3's fused kernels, next session
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 16  # batches that fit; replicas
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 17  # D3's fused kernels, checked again
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 18  # two GPUs (nvidia-h200-x2 only)
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 19  # compile, edges symbolic; D3 list
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 20  # compile's start-up; TF32 + compile
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 21  # compile: start-up, profile; D3
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 22  # D3 timed longer; compiled profile
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 23  # start-up's parts; NVRTC cache; MH-1
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 24  # start-up profiled; MH-1 and 216
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 25  # POLAR-1 engine; MH-1 1,728; hybrid
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 26  # POLAR-1 engine (graph-longrange); hybrid
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 27  # 32,768 atoms compiled, profiled
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 28  # 32,768 with time for it; MH-1 TF32
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 29  # radial tables: tests, 13,824 atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 30  # radial tables: 32,768, 1,728, 216
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 31  # radial tables: 1,728 and 216 again
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 32  # 256 replicas; 1 and 64 with tables
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 33  # 1 to 256 replicas; batches' memory
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 34  # 1 to 256 replicas, tables + compile
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 35  # first calls at new sizes; gpu tests
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 36  # quiet runs; float64 after float32
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 37  # the default path: 216 to 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 38  # default 32,768; start-up; tests
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 39  # start-up, compiled default path
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 40  # Dynamo's precompile cache; uncompiled
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 41  # quiet runs and tables, lean import
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 42  # start-up, compiled ahead of time
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 43  # AOT: default path speed; gpu tests
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 46  # own convolution; relax gpu tests
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 47  # AOTInductor's crash, backtraced
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 48  # the crash: which libstdc++
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 49  # the crash: std::regex alone
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 50  # regex probe; edges in chunks, 1M atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 51  # where a large cell's memory goes
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 52  # gpu tests; no-grad weights, default path
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 53  # large cells: each chunk timed, memory by owner
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 54  # the ensembles on the demo model, 20 ps
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 55  # 1M atoms: where the first evaluation is stuck
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 56  # padding spread over nodes: 13,824 to 1M atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 57  # failed capture hands its pool back; 1M atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 58  # graphs that would not fit; 1M atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 59  # start-up with converted models kept; 157k eager
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 60  # engine gpu tests again; start-up at 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 61  # kept conversions on CUDA; compile's warm parts
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 62  # AOTInductor's wrapper: how libstdc++ is linked
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 63  # kept conversions in float32; AOTI loaded twice
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 64  # compiled start-up, conversion kept; AOTI's load
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 65  # AOTI without the ISA probes, against torch.compile
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 66  # compiled warm start fixed; AOTI's loader direct
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 67  # stage 66's first half (the device time left)
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 68  # why a regrown list recompiles on CUDA
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 69  # the own product basis: tests, kernels
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 70  # issue 32: gpu tests; before/after, .baseline
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 71  # product basis gpu test; before/after 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 72  # compiled start-up, padding nodes by atoms
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 73  # product basis tiled; stage 72
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 74  # product basis tiled, 13,824 only
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 75  # own convolution v2 against cuEq
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 76  # the BF16 tier: tests, accuracy, speed
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 77  # start-up compiled ahead of time; stage 70's failures
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 78  # stage 75; the product basis at 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 79  # conv at 1,728 and 13,824, other launches
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 80  # conv GPU test; stage 77's five GPU tests again
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 81  # compiled start-up: torch.compile, then AOT
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 82  # a million atoms' set-up (H200 only)
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 86  # own conv, runs once per block; default 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 87  # the default path at the targets' sizes
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 88  # MH-1's default; cuEq's forced path beside
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 89  # kernel profiles; a warm start profiled
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 90  # pair tables: GPU tests, MH-1 (failed build)
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 91  # pair tables: MH-1 at 216 and 1,728
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 92  # MH-1's default at 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 93  # issue 30's targets table in one run (H200)
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 94  # issue 30's kernel rows at 13,824 (H200)
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 95  # MH-1's pair tables inside the convolution
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 96  # the step's arithmetic fused: before/after
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 99  # stacked layers: MH-1 216, MP-0 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 102 # 101 + the convolution's register caps
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 104 # stacked layers: forces, capture
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 105 # stacked layers: 216 before/after
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 106 # convolution: indices loaded ahead
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 108 # a million atoms today (H200)
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 109 # convolution's rows; its GPU tests
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 110 # two channels a thread: 13,824 before/after
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 111 # four channels a thread; two warps; two edges
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 112 # register room; where the convolution pays now
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 113 # stage 112 in 400 s: 1,728, launches
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 114 # the default path, 216 and 13,824
#   . .gpu/setup.sh && bash tools/validation/startup_gpu.sh 115 # MH-1's default path, 216
#
# Stage 7 compares this checkout with the source tree in .baseline/ (carry it), made with
# `git archive COMMIT packages/fastmace/src benchmarks | tar -x -C .baseline`.
#
# Everything a stage writes under $OUT ends in one archive, $OUT/results-STAGE.tgz: the device
# returns at most eight files.
set -u
OUT=${OUT:-/tmp/startup-gpu}
mkdir -p "$OUT"
export FASTMACE_CACHE=${FASTMACE_CACHE:-/tmp/fastmace-cache}
# .gpu/setup.sh installs with --no-compile; pip compiles bytecode at install and keeps its
# warnings to itself, so a user never sees graph-longrange's SyntaxWarning ('\D' in a
# docstring) that its first import here would print into the quiet-run tests.
python3 -m compileall -q /tmp/gpu-site/graph_longrange > /dev/null 2>&1 || true
export PYTHONPATH="$PWD/packages/fastmace/src:${PYTHONPATH:-}"
tests=packages/fastmace/tests

pair_tests() {  # the pair-sharing GPU tests on every backend, into gpu_tests_STAGE.txt
  timeout 110 python3 -m pytest -v -m gpu -p no:cacheprovider "$tests/test_pair_radials.py" \
    > "$OUT/gpu_tests_$1.txt" 2>&1
  echo "pair-radial gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_$1.txt"))"
}

polar_tests() {  # MACE-POLAR-1's GPU tests (the engine on CUDA against mace-torch)
  timeout 120 python3 -m pytest -v -m gpu -p no:cacheprovider "$tests/test_polar_md.py" \
    "$tests/test_polar.py" > "$OUT/gpu_tests_polar.txt" 2>&1
  echo "polar gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_polar.txt"))"
}

gpu_tests() {  # gpu_tests STAGE TIMEOUT PYTEST-ARGS...: the GPU tests named, into gpu_tests_STAGE.txt
  local stage=$1 limit=$2
  shift 2
  # SIGINT, unbuffered: a run that runs out of time still says which tests passed (stage 78's
  # SIGTERM left an empty file).
  timeout -s INT -k 20 "$limit" python3 -u -m pytest -q -m gpu -p no:cacheprovider \
    --durations=10 "$@" > "$OUT/gpu_tests_$stage.txt" 2>&1
  echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_$stage.txt"))"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/gpu_tests_$stage.txt" | head
}

compiled_startup() {  # compiled_startup TIMEOUT RUN-TIMEOUT: fastmace md --compile at 13,824 atoms
  timeout "$1" python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s "$2" \
    --out "$OUT/startup-13824" --extra=--compile > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824 (compiled): exit $?"
  grep -h "start-up" "$OUT"/startup-13824/*.log
}

default_startup() {  # default_startup TIMEOUT RUN-TIMEOUT NAME [OPTIONS...]: stages 116-118
  # fastmace md at 13,824 atoms on today's default path: 2,000 steps so that the planner takes
  # FastMACE's convolution (it pays from about 1,750), compile forced as the default takes it
  # for long runs; cold then warm (OPTIONS: more startup_time.py options), into $OUT/NAME.
  local limit=$1 run_limit=$2 name=$3
  shift 3
  timeout "$limit" python3 benchmarks/startup_time.py --atoms 13824 --steps 2000 \
    --timeout-s "$run_limit" --out "$OUT/$name" --extra=--compile "$@" > "$OUT/$name.log" 2>&1
  echo "start-up 13824 ($name, default path, compiled): exit $?"
  grep -H "^start-up\|  workers" "$OUT/$name"/*.log | sed "s|^$OUT/$name/||" | cut -c1-400
}

aot_startup() {  # aot_startup TIMEOUT RUN-TIMEOUT: the same, through a package compiled ahead of time
  timeout "$1" python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s "$2" \
    --ahead-of-time-on-cuda --out "$OUT/startup-13824-aot" --extra=--compile \
    > "$OUT/startup-13824-aot.log" 2>&1
  echo "start-up 13824 (compiled ahead of time): exit $?"
  grep -hE "start-up|^done|rror" "$OUT"/startup-13824-aot/*.log | cut -c1-300
}

before_after() {  # md_speed.py on .baseline's source, then on this checkout: the same CASES
  TEST_TIMEOUT_S=$1 BEFORE_BUDGET_S=110 AFTER_BUDGET_S=$2 OUT="$OUT" \
    bash tools/validation/perf_gpu.sh .baseline "$3" "$3"
}

product_kernels() {  # TIMEOUT ATOMS: benchmarks/product_kernels.py, ours against cuEq's
  timeout "$1" python3 benchmarks/product_kernels.py --atoms "$2" \
    --out "$OUT/product" > "$OUT/product_kernels.log" 2>&1
  echo "product kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/product_kernels.log" | cut -c1-100
}

speed_before_after() {  # TIMEOUT BUDGET CASE-TIMEOUT ONLY: md_speed.py on .baseline, then here
  local site=${PYTHONPATH#"$PWD/packages/fastmace/src:"}
  PYTHONPATH=".baseline/packages/fastmace/src:$site" timeout "$1" python3 \
    .baseline/benchmarks/md_speed.py --out "$OUT/before" --budget-s "$2" --case-timeout-s "$3" \
    --only "$4" > "$OUT/before.log" 2>&1
  echo "before: exit $?"
  timeout "$1" python3 benchmarks/md_speed.py --out "$OUT/after" --budget-s "$2" \
    --case-timeout-s "$3" --only "$4" > "$OUT/after.log" 2>&1
  echo "after: exit $?"
  grep -hE "\| (mp0|mh)" "$OUT"/before/md_speed.md "$OUT"/after/md_speed.md
}

profiled_before_after() {  # TIMEOUT BUDGET CASE-TIMEOUT ONLY: speed_before_after, profiled
  local site=${PYTHONPATH#"$PWD/packages/fastmace/src:"}
  PYTHONPATH=".baseline/packages/fastmace/src:$site" timeout "$1" python3 \
    .baseline/benchmarks/md_speed.py --out "$OUT/before" --budget-s "$2" --case-timeout-s "$3" \
    --profile --only "$4" > "$OUT/before.log" 2>&1
  echo "before: exit $?"
  timeout "$1" python3 benchmarks/md_speed.py --out "$OUT/after" --budget-s "$2" \
    --case-timeout-s "$3" --profile --only "$4" > "$OUT/after.log" 2>&1
  echo "after: exit $?"
  grep -hE "ms/step|Error|error|GEMM|skipp" "$OUT/before.log" "$OUT/after.log" | tail -40
}

case "${1:-1}" in
1)
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_relax.py" \
    "$tests/test_quiet_run.py" "$tests/test_engine_gpu.py" "$tests/test_neighbours.py" \
    "$tests/test_potential.py" "$tests/test_engine_settings.py" "$tests/test_integrators.py" \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests.txt"))"
  timeout 250 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 120 \
    --out "$OUT/startup-13824" > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824: exit $?"
  timeout 150 python3 benchmarks/md_speed.py --out "$OUT/speed-d3" --budget-s 120 \
    --case-timeout-s 100 --only "mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-d3" \
    > "$OUT/speed-d3.log" 2>&1
  echo "D3 cost: exit $?"
  ;;
3)
  timeout 380 python3 benchmarks/startup_time.py --atoms 1728 --steps 3000 --timeout-s 185 \
    --out "$OUT/startup-1728-compile" --extra --compile > "$OUT/startup-1728-compile.log" 2>&1
  echo "compile start-up 1728: exit $?"
  ;;
4)
  # The retry of stage 2 that fits one call: the quiet-run tests verbosely, the load profile,
  # D3's cost at 1,728 atoms and the largest cell.
  timeout 150 python3 -m pytest -v -m gpu -p no:cacheprovider "$tests/test_quiet_run.py" \
    > "$OUT/gpu_tests_4.txt" 2>&1
  echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_4.txt"))"
  timeout 100 python3 benchmarks/startup_time.py --atoms 216 --steps 40 --timeout-s 90 --profile \
    --out "$OUT/startup-216-profile" > "$OUT/startup-216-profile.log" 2>&1
  echo "start-up profile 216: exit $?"
  timeout 270 python3 benchmarks/md_speed.py --out "$OUT/speed" --budget-s 240 \
    --case-timeout-s 200 > "$OUT/speed.log" 2>&1 \
    --only "mp0-medium/1728/fastmace-cueq,mp0-medium/1728/fastmace-cueq-d3,mp0-medium/157464/fastmace-cueq"
  echo "speed: exit $?"
  ;;
5)
  # D3(BJ) under fastmace md, with a stack dump if it stalls: 216 and 1,728 atoms.
  for atoms in 216 1728; do
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from startup_time import nacl; \
nacl($atoms).write('/tmp/nacl-$atoms.extxyz')"
    limit=$(( atoms > 1000 ? 120 : 60 ))
    timeout $((limit + 10)) python3 -c "import faulthandler, sys; \
faulthandler.dump_traceback_later($limit, exit=True); from fastmace.cli.main import main; \
sys.exit(main(sys.argv[1:]))" md "/tmp/nacl-$atoms.extxyz" --model template:mp0-medium \
      --dtype float32 --backend cueq --steps 200 --traj-every 0 --temperature 300 \
      --dispersion d3bj --dispersion-functional pbe --output "$OUT/d3-$atoms" \
      > "$OUT/d3-$atoms.log" 2>&1
    echo "D3 $atoms: exit $?"
  done
  ;;
6)
  # D3's profile (its search and evaluation captured alone, the kernel table), then its cost
  # beside the plain step at 1,728 and 13,824 atoms, then the quiet-run tests.
  timeout 200 python3 benchmarks/profile_step.py --dispersion --atoms 1728 --no-operators \
    --timed-blocks 2 --out "$OUT/profile-d3" > "$OUT/profile-d3.log" 2>&1
  echo "D3 profile: exit $?"
  timeout 250 python3 benchmarks/md_speed.py --out "$OUT/speed-d3" --budget-s 230 \
    --case-timeout-s 120 > "$OUT/speed-d3.log" 2>&1 --only \
    "mp0-medium/1728/fastmace-cueq,mp0-medium/1728/fastmace-cueq-d3,mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-d3"
  echo "D3 cost: exit $?"
  timeout 120 python3 -m pytest -v -m gpu -p no:cacheprovider "$tests/test_quiet_run.py" \
    > "$OUT/gpu_tests_6.txt" 2>&1
  echo "quiet-run tests: exit $? ($(tail -1 "$OUT/gpu_tests_6.txt"))"
  ;;
7)
  before_after 160 150 \
    "mp0-medium/216/fastmace-cueq,mp0-medium/1728/fastmace-cueq,mp0-medium/13824/fastmace-cueq"
  ;;
8)
  pair_tests 8
  timeout 170 python3 benchmarks/profile_step.py --atoms 216,13824 --no-operators \
    --out "$OUT/profile" > "$OUT/profile.log" 2>&1
  echo "profile: exit $?"
  timeout 240 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 115 \
    --out "$OUT/startup-13824" > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824: exit $?"
  ;;
9)
  # The pair tests on every backend, then before (.baseline) and after at 1,728 and 13,824
  # (the general GPU tests skipped: a 1 s limit).
  pair_tests 9
  before_after 1 140 "mp0-medium/13824/fastmace-cueq,mp0-medium/1728/fastmace-cueq"
  ;;
10)
  # torch.compile on the pair-shared model (cuEq's indexed convolution inside Dynamo).
  timeout 470 python3 benchmarks/md_speed.py --out "$OUT/speed-compile" --force-errors \
    --budget-s 450 --case-timeout-s 240 > "$OUT/speed-compile.log" 2>&1 --only \
    "mp0-medium/13824/fastmace-cueq-compile,mp0-medium/216/fastmace-cueq-compile"
  echo "compile: exit $?"
  ;;
11)
  # D3's cost at 1,728 atoms alone, for a short call (the plain step is in stage 9).
  timeout 170 python3 benchmarks/md_speed.py --out "$OUT/speed-d3" --budget-s 150 \
    --case-timeout-s 140 --only "mp0-medium/1728/fastmace-cueq-d3" > "$OUT/speed-d3.log" 2>&1
  echo "D3 1728: exit $?"
  ;;
12)
  # The next session's first call: D3 in closed form with rarer searches beside the plain
  # step, the hybrid backend with the pair sharing, then D3's profile.
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/speed" --budget-s 310 \
    --case-timeout-s 150 --force-errors > "$OUT/speed.log" 2>&1 --only \
    "mp0-medium/1728/fastmace-cueq,mp0-medium/1728/fastmace-cueq-d3,mp0-medium/13824/fastmace-cueq-d3,mp0-medium/216/fastmace-hybrid,mp0-medium/13824/fastmace-hybrid"
  echo "speed: exit $?"
  timeout 200 python3 benchmarks/profile_step.py --dispersion --atoms 1728 --no-operators \
    --timed-blocks 2 --out "$OUT/profile-d3" > "$OUT/profile-d3.log" 2>&1
  echo "D3 profile: exit $?"
  ;;
13)
  # Why the hybrid backend is 1.47x cuEq at 13,824 atoms, and D3's cost there, by kernel.
  timeout 220 python3 benchmarks/profile_step.py --backend hybrid --atoms 13824 --no-operators \
    --timed-blocks 2 --out "$OUT/profile-hybrid" > "$OUT/profile-hybrid.log" 2>&1
  echo "hybrid profile: exit $?"
  timeout 260 python3 benchmarks/profile_step.py --dispersion --atoms 13824 --no-operators \
    --timed-blocks 2 --out "$OUT/profile-d3-13824" > "$OUT/profile-d3-13824.log" 2>&1
  echo "D3 profile 13824: exit $?"
  ;;
14)
  # Issue 15: 1 to 256 replicas of the 216-atom cell, and a 256-rung exchange ladder; the
  # replica and exchange tests with CUDA graphs.
  # (Second call: the exchange inside the captured block; the tests first, then whatever of
  # the benchmark fits, smallest batch first, each case written as it ends.)
  timeout 130 python3 -m pytest -q -p no:cacheprovider "$tests/test_replica_exchange.py" \
    > "$OUT/gpu_tests_replicas.txt" 2>&1
  echo "replica tests: exit $? ($(tail -1 "$OUT/gpu_tests_replicas.txt"))"
  timeout 230 python3 benchmarks/replica_throughput.py --replicas 1,64,256 --exchange 64 \
    --seconds 3 --out "$OUT/replicas" > "$OUT/replicas.log" 2>&1
  echo "replicas: exit $?"
  ;;
15)
  # The next session's first call: D3's fused Triton kernels compiled (tests), then D3's cost
  # with them at 1,728 and 13,824 atoms beside the plain step, and the profile with both
  # kernels timed alone; the narrower bins of D3's list are in the same numbers.
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    "$tests/test_dispersion_triton.py" > "$OUT/gpu_tests_d3_triton.txt" 2>&1
  echo "D3 triton tests: exit $? ($(tail -1 "$OUT/gpu_tests_d3_triton.txt"))"
  timeout 260 python3 benchmarks/md_speed.py --out "$OUT/speed" --budget-s 240 \
    --case-timeout-s 120 > "$OUT/speed.log" 2>&1 --only \
    "mp0-medium/1728/fastmace-cueq-d3,mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-d3"
  echo "speed: exit $?"
  timeout 170 python3 benchmarks/profile_step.py --dispersion --atoms 13824 --no-operators \
    --timed-blocks 2 --out "$OUT/profile-d3" > "$OUT/profile-d3.log" 2>&1
  echo "D3 profile: exit $?"
  ;;
16)
  # Issue 15: 2,048 replicas of the 216-atom cell sized into batches from measured memory (no
  # limit given), then 1, 8 and 256 replicas' throughput timed on steady replays only.
  timeout 330 python3 tools/validation/batches_gpu.py --replicas 2048 --steps 40 \
    --out "$OUT/batches" > "$OUT/batches.log" 2>&1
  echo "batches: exit $? ($(tail -c 600 "$OUT/batches.log"))"
  timeout 240 python3 benchmarks/replica_throughput.py --replicas 1,8,256 --seconds 3 \
    --out "$OUT/replicas" > "$OUT/replicas.log" 2>&1
  echo "replicas: exit $?"
  ;;
17)
  # Stage 15 again after the run's kernel check stopped taking rounding noise for an error
  # (a perfect crystal's forces cancel to 1e-17 eV/Å): tests, then D3's cost with the fused
  # kernels (the plain 13,824-atom step was measured in stage 15 the same day).
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    "$tests/test_dispersion_triton.py" > "$OUT/gpu_tests_d3_triton.txt" 2>&1
  echo "D3 triton tests: exit $? ($(tail -1 "$OUT/gpu_tests_d3_triton.txt"))"
  timeout 230 python3 benchmarks/md_speed.py --out "$OUT/speed" --budget-s 210 \
    --case-timeout-s 120 > "$OUT/speed.log" 2>&1 --only \
    "mp0-medium/1728/fastmace-cueq-d3,mp0-medium/13824/fastmace-cueq-d3"
  echo "speed: exit $? ($(grep -o "dispersion_kernel[^,]*" "$OUT/speed/md_speed.json"))"
  ;;
18)
  # Issue 15 on the two-GPU machine: the spread tests (one GPU against two, with replica
  # exchange over NCCL), then replicas' throughput on one GPU and on two.
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_spread.py" \
    > "$OUT/gpu_tests_spread.txt" 2>&1
  echo "spread tests: exit $? ($(tail -1 "$OUT/gpu_tests_spread.txt"))"
  timeout 380 python3 benchmarks/gpus_throughput.py --replicas 64,256 --steps 600 \
    --out "$OUT/gpus" > "$OUT/gpus.log" 2>&1
  echo "gpus: exit $? ($(cat "$OUT/gpus/gpus_throughput.md" 2>/dev/null | tail -4))"
  ;;
19)
  # Issue 11: torch.compile with the number of edges symbolic (one compilation however often
  # the list regrows) beside the uncompiled step at 216 and 13,824 atoms, forces checked
  # against float64 e3nn; then D3 at 13,824 atoms with its long list searched once per two
  # blocks (two captured graphs).
  timeout 340 python3 benchmarks/md_speed.py --out "$OUT/speed-compile" --force-errors \
    --budget-s 320 --case-timeout-s 160 > "$OUT/speed-compile.log" 2>&1 --only \
    "mp0-medium/216/fastmace-cueq,mp0-medium/216/fastmace-cueq-compile,mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-compile"
  echo "compile: exit $? ($(grep -o '"dynamo_graphs": [0-9]*' "$OUT/speed-compile/md_speed.json" | tr '\n' ' '))"
  timeout 200 python3 benchmarks/md_speed.py --out "$OUT/speed-d3" --budget-s 180 \
    --case-timeout-s 170 --only "mp0-medium/13824/fastmace-cueq-d3" > "$OUT/speed-d3.log" 2>&1
  echo "D3 13824: exit $?"
  ;;
20)
  # torch.compile's cost before the first step: fastmace md --compile at 13,824 atoms twice,
  # with Inductor's cache cold and then warm; then TF32 + compile at 13,824 and 1,728 atoms.
  FASTMACE_CACHE=/tmp/fastmace-cache-20 timeout 330 python3 benchmarks/startup_time.py \
    --atoms 13824 --steps 400 --timeout-s 160 \
    --out "$OUT/startup-13824-compile" --extra=--compile > "$OUT/startup-13824-compile.log" 2>&1
  echo "compile start-up 13824: exit $?"
  timeout 250 python3 benchmarks/md_speed.py --out "$OUT/speed-tf32" --force-errors \
    --budget-s 230 --case-timeout-s 120 > "$OUT/speed-tf32.log" 2>&1 --only \
    "mp0-medium/13824/fastmace-cueq-tf32-compile,mp0-medium/1728/fastmace-cueq-compile"
  echo "TF32 + compile: exit $?"
  ;;
21)
  # Issue 11, the next call: compile's start-up at 13,824 atoms (Inductor's cache cold, then
  # warm), D3's cost there timed on graph replays only (its two block patterns are captured
  # one after the other), and the compiled step's kernel profile.
  FASTMACE_CACHE=/tmp/fastmace-cache-21 timeout 240 python3 benchmarks/startup_time.py \
    --atoms 13824 --steps 400 --timeout-s 110 \
    --out "$OUT/startup-13824-compile" --extra=--compile > "$OUT/startup-13824-compile.log" 2>&1
  echo "compile start-up 13824: exit $?"
  timeout 170 python3 benchmarks/md_speed.py --out "$OUT/speed-d3" --budget-s 150 \
    --case-timeout-s 100 > "$OUT/speed-d3.log" 2>&1 --only \
    "mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-d3"
  echo "D3 13824: exit $?"
  timeout 160 python3 benchmarks/profile_step.py --compile --atoms 13824 --no-operators \
    --timed-blocks 2 --out "$OUT/profile-compile" > "$OUT/profile-compile.log" 2>&1
  echo "compiled profile 13824: exit $?"
  ;;
22)
  # Stage 21 with what it lacked: D3's two block patterns both timed (more blocks), and the
  # compiled profile after the list's early regrowth (cuEquivariance's kernel choice fixed, as
  # fastmace md's plan does).
  timeout 190 python3 benchmarks/md_speed.py --out "$OUT/speed-d3" --budget-s 180 \
    --target-s 12 --case-timeout-s 90 > "$OUT/speed-d3.log" 2>&1 --only \
    "mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-d3"
  echo "D3 13824: exit $?"
  CUEQUIVARIANCE_OPS_U1D_ALGOS=2 timeout 150 python3 benchmarks/profile_step.py --compile \
    --atoms 13824 --no-operators --timed-blocks 8 --out "$OUT/profile-compile" \
    > "$OUT/profile-compile.log" 2>&1
  echo "compiled profile 13824: exit $?"
  ;;
23)
  # Issue 11: where the warm start-up's load and set-up go (fm.load's parts, the engine's
  # set-up parts), with cuEquivariance-ops' NVRTC kernel cache cold and then warm: a fresh
  # cache root (everything cold, then everything warm), then a fresh kernel directory alone
  # (descriptors warm, kernels cold, then warm). Then MH-1 compiled with kernel profiles.
  FASTMACE_CACHE=/tmp/fastmace-cache-23 timeout 200 python3 benchmarks/startup_time.py \
    --atoms 13824 --steps 100 --timeout-s 95 --out "$OUT/startup-13824" \
    > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824, fresh cache root: exit $?"
  FASTMACE_CACHE=/tmp/fastmace-cache-23 CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR=/tmp/nvrtc-23b \
    timeout 170 python3 benchmarks/startup_time.py --atoms 13824 --steps 100 --timeout-s 80 \
    --out "$OUT/startup-13824-nvrtc" > "$OUT/startup-13824-nvrtc.log" 2>&1
  echo "start-up 13824, fresh NVRTC cache: exit $? ($(ls /tmp/nvrtc-23b 2>/dev/null | wc -l) kernels)"
  CUEQUIVARIANCE_OPS_U1D_ALGOS=2 timeout 210 python3 benchmarks/md_speed.py \
    --out "$OUT/speed-mh1" --profile --force-errors --budget-s 190 --case-timeout-s 150 \
    --only "mh-1/216/fastmace-cueq-compile,mh-1/1728/fastmace-cueq-compile" \
    > "$OUT/speed-mh1.log" 2>&1
  echo "MH-1 compiled: exit $?"
  ;;
24)
  # Where the warm start-up's 11-14 s of model reading and 5 s of first forces go: fastmace md
  # at 13,824 atoms under cProfile and -X importtime (a cold run fills the caches first). Then
  # MH-1 at 1,728 atoms and MP-0 medium at 216 atoms compiled, with kernel profiles.
  FASTMACE_CACHE=/tmp/fastmace-cache-24 timeout 300 python3 benchmarks/startup_time.py \
    --atoms 13824 --steps 60 --timeout-s 140 --profile --importtime \
    --out "$OUT/startup-profile" > "$OUT/startup-profile.log" 2>&1
  echo "start-up profile 13824: exit $?"
  timeout 230 python3 benchmarks/md_speed.py --out "$OUT/speed-compiled" --profile \
    --force-errors --budget-s 215 --case-timeout-s 150 \
    --only "mh-1/1728/fastmace-cueq-compile,mp0-medium/216/fastmace-cueq-compile" \
    > "$OUT/speed-compiled.log" 2>&1
  echo "compiled profiles: exit $?"
  ;;
25)
  # MACE-POLAR-1 in the MD engine on CUDA (eager, e3nn) against mace-torch; whether the order
  # of the edges changes cuEquivariance's kernel time (benchmarks/edge_order.py); MH-1 at 1,728
  # atoms compiled alone (its compilation takes about two minutes), MP-0 medium at 1,728
  # compiled with its kernel profile, and the hybrid backend compiled at 13,824 atoms.
  polar_tests
  CUEQUIVARIANCE_OPS_U1D_ALGOS=2 timeout 100 python3 benchmarks/edge_order.py --atoms 13824 --out "$OUT/edge-order" \
    > "$OUT/edge-order.log" 2>&1
  echo "edge order: exit $? ($(grep -c ms_per_call "$OUT/edge-order.log") orders)"
  timeout 190 python3 benchmarks/md_speed.py --out "$OUT/speed-mh1-1728" --profile \
    --force-errors --budget-s 180 --case-timeout-s 175 --only "mh-1/1728/fastmace-cueq-compile" \
    > "$OUT/speed-mh1-1728.log" 2>&1
  echo "MH-1 1728 compiled: exit $?"
  timeout 190 python3 benchmarks/md_speed.py --out "$OUT/speed-more" --profile \
    --force-errors --budget-s 180 --case-timeout-s 140 \
    --only "mp0-medium/1728/fastmace-cueq-compile,mp0-medium/13824/fastmace-hybrid-compile" \
    > "$OUT/speed-more.log" 2>&1
  echo "MP-0 1728 compiled, hybrid 13824 compiled: exit $?"
  ;;
26)
  # Stage 25's two parts that did not run: the POLAR-1 GPU tests (the bundle now carries
  # graph-longrange) and the hybrid backend compiled at 13,824 atoms.
  polar_tests
  timeout 200 python3 benchmarks/md_speed.py --out "$OUT/speed-hybrid" --profile \
    --force-errors --budget-s 195 --case-timeout-s 190 \
    --only "mp0-medium/13824/fastmace-hybrid-compile" > "$OUT/speed-hybrid.log" 2>&1
  echo "hybrid 13824 compiled: exit $?"
  ;;
27)
  # The issue's 32,768-atom row, compiled, with its kernel profile (not measured since 11-29).
  timeout 160 python3 benchmarks/md_speed.py --out "$OUT/speed-32768" --profile \
    --force-errors --budget-s 155 --case-timeout-s 150 --target-s 2 \
    --only "mp0-medium/32768/fastmace-cueq-compile" > "$OUT/speed-32768.log" 2>&1
  echo "32768 compiled: exit $?"
  ;;
28)
  # Stage 27 again with the time it needs (its compilation alone takes about two minutes), the
  # uncompiled step beside it; then MH-1 at 216 atoms with TF32 matmuls and compile.
  timeout 350 python3 benchmarks/md_speed.py --out "$OUT/speed-32768" --profile \
    --force-errors --budget-s 340 --case-timeout-s 250 --target-s 2 \
    --only "mp0-medium/32768/fastmace-cueq-compile,mp0-medium/32768/fastmace-cueq" \
    > "$OUT/speed-32768.log" 2>&1
  echo "32768 compiled and not: exit $?"
  timeout 170 python3 benchmarks/md_speed.py --out "$OUT/speed-mh1-tf32" --profile \
    --force-errors --budget-s 160 --case-timeout-s 150 \
    --only "mh-1/216/fastmace-cueq-tf32-compile" > "$OUT/speed-mh1-tf32.log" 2>&1
  echo "MH-1 216 TF32 compiled: exit $?"
  ;;
29)
  # Radial weights from tables: the kernels and the tabulated model on the GPU (tests), then
  # 13,824 atoms with tables, compiled and not, beside the compiled MLP step, each with its
  # kernel profile and its forces against float64 e3nn.
  timeout 150 python3 -m pytest -v -m gpu -p no:cacheprovider "$tests/test_radial_table.py" \
    > "$OUT/gpu_tests_radial_table.txt" 2>&1
  echo "radial table gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_radial_table.txt"))"
  timeout 420 python3 benchmarks/md_speed.py --out "$OUT/speed-table-13824" --profile \
    --force-errors --budget-s 410 --case-timeout-s 200 --only \
    "mp0-medium/13824/fastmace-cueq-table-compile,mp0-medium/13824/fastmace-cueq-compile,mp0-medium/13824/fastmace-cueq-table" \
    > "$OUT/speed-table-13824.log" 2>&1
  echo "tables 13824: exit $?"
  ;;
30)
  # 32,768 atoms compiled, with tables and without (no float64 reference: at this size it
  # does not fit beside the run), then 216 and 1,728 atoms with tables, compiled, and MH-1 at
  # 216 atoms with TF32 and compile.
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/speed-32768" --profile \
    --budget-s 320 --case-timeout-s 200 --target-s 2 --only \
    "mp0-medium/32768/fastmace-cueq-table-compile,mp0-medium/32768/fastmace-cueq-compile" \
    > "$OUT/speed-32768.log" 2>&1
  echo "32768 compiled, tables and not: exit $?"
  timeout 230 python3 benchmarks/md_speed.py --out "$OUT/speed-small" --profile \
    --force-errors --budget-s 220 --case-timeout-s 150 --only \
    "mp0-medium/1728/fastmace-cueq-table-compile,mp0-medium/216/fastmace-cueq-table-compile,mh-1/216/fastmace-cueq-tf32-compile" \
    > "$OUT/speed-small.log" 2>&1
  echo "216 and 1728 with tables, MH-1 TF32: exit $?"
  ;;
31)
  # Stage 30's small sizes, which its budget skipped, beside the compiled MLP step at 1,728.
  timeout 480 python3 benchmarks/md_speed.py --out "$OUT/speed-small" --profile \
    --force-errors --budget-s 470 --case-timeout-s 150 --only \
    "mp0-medium/1728/fastmace-cueq-table-compile,mp0-medium/216/fastmace-cueq-table-compile,mp0-medium/1728/fastmace-cueq-compile" \
    > "$OUT/speed-small.log" 2>&1
  echo "216 and 1728 with tables, 1728 without: exit $?"
  ;;
32)
  # Issue 15: 256 replicas in a call of their own (two earlier calls ran out of time before
  # them), then 1 and 64 replicas with radial tables.
  timeout 270 python3 benchmarks/replica_throughput.py --replicas 256 --seconds 3 \
    --out "$OUT/replicas-256" > "$OUT/replicas-256.log" 2>&1
  echo "256 replicas: exit $?"
  timeout 200 python3 benchmarks/replica_throughput.py --replicas 1,64 --seconds 3 \
    --radial-table --out "$OUT/replicas-table" > "$OUT/replicas-table.log" 2>&1
  echo "1 and 64 replicas with tables: exit $?"
  ;;
33)
  # Issue 15: 1, 8, 64 and 256 replicas in one run, now with cuEquivariance's kernel choice
  # fixed; then 2,048 replicas in batches sized from measured memory, to see the allocator's
  # reserved peak now that a finished batch is released before the next one sets up.
  timeout 300 python3 benchmarks/replica_throughput.py --replicas 1,8,64,256 --seconds 3 \
    --out "$OUT/replicas" > "$OUT/replicas.log" 2>&1
  echo "replicas: exit $? ($(tail -6 "$OUT/replicas/replica_throughput.md" 2>/dev/null))"
  timeout 250 python3 tools/validation/batches_gpu.py --steps 40 --out "$OUT/batches" \
    > "$OUT/batches.log" 2>&1
  echo "batches: exit $? ($(tail -c 400 "$OUT/batches.log"))"
  ;;
34)
  # Issue 15: the same four batch sizes with the fastest settings for one cell and for many
  # alike (radial tables and torch.compile), so the ratio compares best with best.
  timeout 560 python3 benchmarks/replica_throughput.py --replicas 1,8,64,256 --seconds 3 \
    --radial-table --compile --out "$OUT/replicas-compile" > "$OUT/replicas-compile.log" 2>&1
  echo "replicas compiled: exit $? ($(tail -6 "$OUT/replicas-compile/replica_throughput.md" 2>/dev/null))"
  ;;
35)
  # What makes a size new to cuEquivariance (batches of 707 and 634 cells paid 50 s each for
  # their first forces); then the engine's GPU tests on this session's code.
  timeout 200 python3 tools/validation/first_call_sizes.py --out "$OUT/first-call" \
    > "$OUT/first-call.log" 2>&1
  echo "first calls: exit $? ($(grep -o '"atoms": [0-9]*, "first_s": [0-9.]*' "$OUT/first-call.log" | tr '\n' ' '))"
  timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_relax.py" \
    "$tests/test_quiet_run.py" "$tests/test_engine_gpu.py" "$tests/test_neighbours.py" \
    "$tests/test_potential.py" "$tests/test_engine_settings.py" "$tests/test_integrators.py" \
    "$tests/test_md_environment.py" > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests.txt"))"
  ;;
36)
  # The quiet-run tests with graph-longrange's bytecode compiled as pip compiles it; then the
  # GPU tests whose float64 references follow float32 models in one process (the Clebsch-Gordan
  # coefficients now float64 whatever was built first): POLAR-1, radial tables, pair radials.
  timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_quiet_run.py" \
    > "$OUT/gpu_tests_quiet.txt" 2>&1
  echo "quiet-run gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_quiet.txt"))"
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_radial_table.py" \
    > "$OUT/gpu_tests_tables.txt" 2>&1
  echo "tables gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_tables.txt"))"
  polar_tests
  pair_tests 36
  ;;
37)
  # Issue 31: fm.md's own plan with no options for a 100 ps run (radial tables and compile
  # chosen by the planner) beside the plain cuEq step and the best forced path, in one process.
  only="mp0-medium/216/fastmace-default,mp0-medium/1728/fastmace-default"
  only="$only,mp0-medium/13824/fastmace-default,mp0-medium/216/fastmace-cueq"
  only="$only,mp0-medium/1728/fastmace-cueq,mp0-medium/13824/fastmace-cueq"
  only="$only,mp0-medium/216/fastmace-cueq-table-compile,mp0-medium/13824/fastmace-cueq-table-compile"
  timeout 560 python3 benchmarks/md_speed.py --out "$OUT/default" --budget-s 520 \
    --case-timeout-s 160 --only "$only" > "$OUT/default.log" 2>&1
  echo "default path: exit $?"
  grep -E "\| (mp0|mh)" "$OUT/default/md_speed.md"
  ;;
38)
  # Issue 31: the default path at 32,768 atoms; start-up of fastmace md at 13,824 atoms on
  # the compiled default path, cold then warm, with each child's slowest imports; a short
  # run's plan once the cache holds this model's compilation; the tables' and engine GPU tests.
  # A cache root of its own: the start-up's cold run is cold even after stage 37.
  export FASTMACE_CACHE=/tmp/fastmace-cache-38
  timeout 250 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 120 \
    --importtime --out "$OUT/startup-13824" --extra=--compile > "$OUT/startup-13824.log" 2>    --importtime --out "$OUT/startup-13824" --extra --compile > "$OUT/startup-13824.log" 2>&11
  echo "start-up 13824 (compiled): exit $?"
  grep -E '"run"|to_first_step|"load_s"|setup_s|first_block' "$OUT/startup-13824.log"
  timeout 200 python3 benchmarks/md_speed.py --out "$OUT/default-32768" --budget-s 180 \
    --case-timeout-s 170 --only "mp0-medium/32768/fastmace-default" \
    > "$OUT/default-32768.log" 2>&1
  echo "default 32768: exit $?"
  grep -E "\| mp0" "$OUT/default-32768/md_speed.md"
  timeout 200 python3 benchmarks/md_speed.py --out "$OUT/default-short" --budget-s 190 \
    --case-timeout-s 180 --planned-steps 3000 --only "mp0-medium/13824/fastmace-default" \
    > "$OUT/default-short.log" 2>&1
  echo "default, 3,000-step plan after a compilation: exit $?"
  grep -E "\| mp0" "$OUT/default-short/md_speed.md"
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_radial_table.py" \
    "$tests/test_engine_gpu.py" > "$OUT/gpu_tests_38.txt" 2>&1
  echo "tables and engine gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_38.txt"))"
  ;;
39)
  # Stage 38's start-up and short-run plan again (its --extra took --compile for an option).
  export FASTMACE_CACHE=/tmp/fastmace-cache-39
  timeout 250 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 120 \
    --importtime --out "$OUT/startup-13824" --extra=--compile > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824 (compiled): exit $?"
  grep -E '"run"|to_first_step|"load_s"|setup_s|first_block' "$OUT/startup-13824.log"
  grep -h "start-up" "$OUT"/startup-13824/*.log
  timeout 200 python3 benchmarks/md_speed.py --out "$OUT/default-short" --budget-s 190 \
    --case-timeout-s 180 --planned-steps 3000 --only "mp0-medium/13824/fastmace-default" \
    > "$OUT/default-short.log" 2>&1
  echo "default, 3,000-step plan after a compilation: exit $?"
  grep -E "\| mp0" "$OUT/default-short/md_speed.md"
  ;;
40)
  # Does Dynamo's guard-serialising cache (TORCH_CACHING_PRECOMPILE=1) take the tracing out
  # of a warm compiled start? Then the uncompiled default start-up, cold and warm, beside it.
  export FASTMACE_CACHE=/tmp/fastmace-cache-40
  TORCH_CACHING_PRECOMPILE=1 timeout 250 python3 benchmarks/startup_time.py --atoms 13824 \
    --steps 200 --timeout-s 120 --out "$OUT/startup-precompile" --extra=--compile \
    > "$OUT/startup-precompile.log" 2>&1
  echo "start-up 13824, compiled, precompile cache: exit $?"
  grep -h "start-up\|^speed\|Error\|rror:" "$OUT"/startup-precompile/*.log | head -20
  export FASTMACE_CACHE=/tmp/fastmace-cache-40b
  timeout 200 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 90 \
    --out "$OUT/startup-default" > "$OUT/startup-default.log" 2>&1
  echo "start-up 13824, default (uncompiled for 200 steps): exit $?"
  grep -h "start-up\|^speed" "$OUT"/startup-default/*.log
  ;;
41)
  # After mace-torch's model code is imported without its trainer: the quiet-run tests (no
  # library warning in a CUDA run, conversion and compilation included) and the tables' tests.
  timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_quiet_run.py" \
    "$tests/test_radial_table.py" > "$OUT/gpu_tests_41.txt" 2>&1
  echo "quiet-run and tables gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_41.txt"))"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_41.txt" | head
  ;;
42)
  # Issue 31: the compiled default path now compiles the whole evaluation ahead of time
  # (dynamics/aot_potential.py): fastmace md at 13,824 atoms, cold (the package is built)
  # then warm (loaded), with each child's slowest imports.
  FASTMACE_CACHE=/tmp/fastmace-cache-probe timeout 170 python3 tools/validation/aot_probe.py \
    > "$OUT/aot_probe.log" 2>&1
  echo "probe at 216 atoms: exit $?"
  tail -30 "$OUT/aot_probe.log"
  export FASTMACE_CACHE=/tmp/fastmace-cache-42 XDG_STATE_HOME=/tmp/fastmace-state-42
  timeout 390 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 300 \
    --importtime --out "$OUT/startup-13824" --extra=--compile > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824 (compiled ahead of time): exit $?"
  grep -E '"run"|to_first_step|"load_s"|setup_s|first_block' "$OUT/startup-13824.log"
  grep -h "start-up\|^speed\|rror" "$OUT"/startup-13824/*.log | head -20
  ;;
44)
  # Stage 42's segfault: the probe alone, phase by phase, Python's stack on a crash.
  FASTMACE_CACHE=/tmp/fastmace-cache-probe timeout 420 python3 -X faulthandler \
    tools/validation/aot_probe.py > "$OUT/aot_probe.log" 2>&1
  echo "probe at 216 atoms: exit $?"
  grep -v Warning "$OUT/aot_probe.log" | tail -40
  ;;
45)
  # Stage 44's crash came in AOTInductor's loader: the same package loaded in a fresh process,
  # one with its weights outside the library, and Inductor's Python wrapper (cold, then warm).
  export FASTMACE_CACHE=/tmp/fastmace-cache-45 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-45
  probe=tools/validation/aot_probe2.py
  for run in inductor inductor; do
    timeout 150 python3 "$probe" inductor 2>&1 | grep -v Warn | grep -E "at |differ|rror" | tail -5
  done
  timeout 150 python3 "$probe" aoti-build /tmp/a.pt2 separate-weights 2>&1 | grep -E "at |rror" | tail -4
  timeout 60 python3 "$probe" aoti-load /tmp/a.pt2 2>&1 | grep -E "at |differ|rror|ault|line" | tail -8
  if command -v gdb > /dev/null; then
    timeout 90 gdb -batch -ex run -ex bt --args python3 "$probe" aoti-load /tmp/a.pt2 2>&1 | tail -25
  else
    echo "no gdb"
  fi
  ;;
46)
  # Issue 30: FastMACE's own convolution (dynamics/conv_triton.py) against the torch formulas
  # and mace-torch on CUDA, then against cuEquivariance's on the same inputs, 216 to 13,824
  # atoms; with WITH_RELAX=1, last session's GPU tests of relaxation (its per-iteration ring)
  # and the engine (9 passed, 2026-12-03 third session).
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_fused_conv.py" \
    > "$OUT/gpu_tests_46_conv.txt" 2>&1
  echo "fused convolution gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_46_conv.txt"))"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/gpu_tests_46_conv.txt" | head
  timeout 200 python3 benchmarks/conv_kernels.py --atoms 216,1728,13824 --out "$OUT/conv" \
    > "$OUT/conv_kernels.log" 2>&1
  echo "convolution kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/conv_kernels.log"
  if [ -n "${WITH_RELAX:-}" ]; then
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_relax.py" \
      "$tests/test_engine_gpu.py" > "$OUT/gpu_tests_46.txt" 2>&1
    echo "relax and engine gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_46.txt"))"
    grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_46.txt" | head
  fi
  ;;
47)
  # Stage 45's loader crash with a native backtrace (segv_backtrace.c; no gdb there), on
  # MP-0 small, whose package builds faster.
  gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so tools/validation/segv_backtrace.c
  export FASTMACE_CACHE=/tmp/fastmace-cache-47 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-47
  export AOT_PROBE_TEMPLATE=mp0-small
  probe=tools/validation/aot_probe2.py
  timeout 240 python3 "$probe" aoti-build /tmp/b.pt2 2>&1 | grep -E "at |rror" | tail -4
  LD_PRELOAD=/tmp/segv_backtrace.so timeout 90 python3 "$probe" aoti-load /tmp/b.pt2 \
    > "$OUT/aoti_load_47.txt" 2>&1
  echo "load: exit $?"
  grep -v Warn "$OUT/aoti_load_47.txt" | tail -45
  ;;
48)
  # Stage 47's backtrace ends in std::regex inside the package's own library (compiled with
  # this machine's g++), called from parse_device_str: a libstdc++ other than the compiler's
  # in the process? Which ones are there, then the load with the compiler's preloaded.
  export FASTMACE_CACHE=/tmp/fastmace-cache-48 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-48
  export AOT_PROBE_TEMPLATE=mp0-small
  g++ --version | head -1
  compiler_lib=$(g++ -print-file-name=libstdc++.so.6); echo "g++'s libstdc++: $(readlink -f "$compiler_lib")"
  python3 -c "import torch, cuequivariance_torch, fastmace.dynamics.potential; \
print('loaded:', sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l}))"
  ldconfig -p | grep "libstdc++" | head -3
  probe=tools/validation/aot_probe2.py
  timeout 150 python3 "$probe" aoti-build /tmp/c.pt2 2>&1 | grep -E "at |rror" | tail -3
  LD_PRELOAD="$(readlink -f "$compiler_lib")" timeout 40 python3 "$probe" aoti-load /tmp/c.pt2 \
    > "$OUT/aoti_load_48.txt" 2>&1
  echo "load with g++'s libstdc++ preloaded: exit $?"
  grep -v Warn "$OUT/aoti_load_48.txt" | grep -E "at |differ|rror|ault" | tail -6
  ;;
49)
  # Stage 48 found one libstdc++ (the compiler's). Does any std::regex built by this g++ crash
  # in this Python, before and after torch, cuEquivariance and FastMACE are imported?
  g++ -shared -fPIC -O2 -std=c++17 -o /tmp/regex_probe.so tools/validation/regex_probe.cpp
  gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so tools/validation/segv_backtrace.c
  export LD_PRELOAD=/tmp/segv_backtrace.so
  python3 -c "import ctypes; print('bare python:', ctypes.CDLL('/tmp/regex_probe.so').probe())" 2>&1 | tail -3
  python3 -c "import torch, ctypes; print('after torch:', ctypes.CDLL('/tmp/regex_probe.so').probe())" 2>&1 | tail -3
  python3 -c "import torch, cuequivariance_torch, fastmace.dynamics.potential, ctypes; \
print('after fastmace:', ctypes.CDLL('/tmp/regex_probe.so').probe())" 2>&1 | grep -v Warn | tail -12
  unset LD_PRELOAD
  command -v clang++ || echo "no clang++"
  ;;
50)
  # Stage 49's std::regex probe; then issue 31's chunked edges: their GPU test (cuEq's fused
  # convolution in chunks against whole) and the largest cells, memory and speed.
  if [ -z "${LARGE_ONLY:-}" ]; then  # LARGE_ONLY=1: the largest cells alone
  g++ -shared -fPIC -O2 -std=c++17 -o /tmp/regex_probe.so tools/validation/regex_probe.cpp
  for imports in "" "torch, " "torch, cuequivariance_torch, fastmace.dynamics.potential, "; do
    timeout 60 python3 -c "import ${imports}ctypes; print('after [${imports}]:', \
ctypes.CDLL('/tmp/regex_probe.so').probe())" 2>&1 | grep -v Warn | tail -3
  done
  command -v clang++ || echo "no clang++"
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_edge_chunks.py" \
    > "$OUT/gpu_tests_50.txt" 2>&1
  echo "edge-chunk gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_50.txt"))"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/gpu_tests_50.txt" | head
  fi
  timeout ${LARGE_TIMEOUT:-330} python3 benchmarks/large_cells.py --atoms "${LARGE_ATOMS:-157464,1000000}" \
    --variants "${LARGE_VARIANTS:-default}" --out "$OUT/large" 2>&1 | grep -v Warn | tail -12
  ;;
51)
  # Stage 50: 157,464 atoms in chunks took 32.6 GiB and 89.6 s for its first forces; a million
  # ran out of memory while capturing (94 GiB live outside the graph's pool). Memory phase by
  # phase, the first evaluation against the second, and what is live at the peak.
  timeout ${PROBE_TIMEOUT:-250} python3 benchmarks/memory_probe.py --atoms "${PROBE_ATOMS:-157464}" \
    --out "$OUT/memory" 2>&1 | grep -v Warn | tail -60
  ;;
52)
  # The weight-sharing copy (weights need no gradients) and pair_radials.indexed_messages, new since
  # stage 50: their GPU tests, then the default path and the plain cuEq step, 216 to 13,824 atoms,
  # against 2026-12-03's figures (default 1.20/3.30/19.4 ms, plain cuEq 2.07/5.39/29.7).
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_pair_radials.py" \
    "$tests/test_edge_chunks.py" "$tests/test_potential.py" > "$OUT/gpu_tests_52.txt" 2>&1
  echo "pair, chunk and potential gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_52.txt"))"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/gpu_tests_52.txt" | head
  only=""
  for atoms in 216 1728 13824; do
    only="$only,mp0-medium/$atoms/fastmace-default,mp0-medium/$atoms/fastmace-cueq"
  done
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/default" --budget-s 300 \
    --case-timeout-s 120 --only "${only#,}" > "$OUT/default.log" 2>&1
  echo "default path: exit $?"
  grep -E "\| (mp0|mh)" "$OUT/default/md_speed.md"
  ;;
53)
  # Issue 31: where a large cell's first evaluation spends its time and where memory goes. On
  # 2026-12-04 the first evaluation at 157,464 atoms took 4.9 s and 24.7 GiB (71 GiB reserved
  # after the eager block), and at 1,000,000 atoms, with expandable segments set by hand, it had
  # not finished after 457 s. Each chunk is timed; the allocator's history covers the whole probe.
  # First, the test that planning leaves CUDA unstarted (the GPU's name from NVML).
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_gpu_name.py" \
    > "$OUT/gpu_tests_53.txt" 2>&1
  echo "gpu name test: exit $? ($(tail -1 "$OUT/gpu_tests_53.txt"))"
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gpu_tests_53.txt" | head
  timeout -k 20 100 python3 benchmarks/memory_probe.py --atoms 157464 --evaluations 1 \
    --out "$OUT/memory" 2>&1 | grep -E "^\[|status" | head -30
  python3 -c "import json; d=json.load(open('$OUT/memory/memory-157464.json')); \
[print(c) for c in d.get('first_evaluation_chunks', [])[:60]]"
  timeout -k 40 ${PROBE_TIMEOUT:-380} python3 benchmarks/memory_probe.py --atoms 1000000 \
    --evaluations 1 --out "$OUT/memory" 2>&1 | grep -E "^\[|status|error" | head -30
  python3 - "$OUT/memory/memory-1000000.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for c in d.get("first_evaluation_chunks", [])[:80]:
    print(c)
for key in ("live_at_peak", "live_at_end"):
    for row in (d.get(key) or [])[:10]:
        print(key, row)
PY
  ;;
54)
  # Issue 33, item 7: the ensembles on the demo model itself, 64 replicas of 32 Cu atoms for
  # 20 ps each (Langevin at 1/ps and 10/ps, CSVR, Nose-Hoover chain, NPT at 0 GPa).
  timeout 560 python3 tools/validation/demo_ensembles.py --out "$OUT/ensembles" \
    --ps ${ENSEMBLE_PS:-20} --replicas ${ENSEMBLE_REPLICAS:-64} 2>&1 | grep -v Warn | tail -8
  find "$OUT/ensembles" -name thermo.csv -delete
  ;;
55)
  # Issue 31: where the first evaluation at 1,000,000 atoms is stuck. Stage 53's probe neither
  # finished in 330 s nor answered SIGTERM within 40 s (stuck in native code), so this one keeps
  # no allocator history, prints each chunk as it ends, and prints every thread's Python stack
  # every 30 s (faulthandler works while the main thread holds the GIL).
  timeout -k 20 ${PROBE_TIMEOUT:-240} python3 benchmarks/memory_probe.py --atoms 1000000 \
    --evaluations 1 --history-entries 0 --traceback-every 30 --out "$OUT/memory" \
    > "$OUT/probe_1000000.log" 2>&1
  echo "probe exit $?"
  grep -vE "^\s*$" "$OUT/probe_1000000.log" | grep -vE "Warn|warn" | head -150
  ;;
56)
  # Issue 31: stage 55 found the 1M-atom first evaluation stuck in the last chunk of each
  # block (51.8 s for one chunk that otherwise takes 0.011 s): the chunk holding the padding
  # edges, all summed with atomic adds into one padding node. Padding is now spread over one
  # node per 8,192 edge slots. Side by side in one process: spread against one padding node
  # at 13,824 and 157,464 atoms; then a million atoms, spread.
  timeout -k 20 230 python3 benchmarks/large_cells.py --atoms 13824,157464 \
    --variants default,one-padding-node --out "$OUT/padding" 2>&1 | grep -E "^\{" | cut -c1-400
  timeout -k 20 ${LARGE_TIMEOUT:-300} python3 benchmarks/large_cells.py --atoms 1000000 \
    --out "$OUT/million" 2>&1 | grep -E "^\{|Error" | cut -c1-600
  ;;
57)
  # Issue 31, a million atoms: stage 56's first evaluation finished (padding spread), then the
  # capture ran out of memory with 131 GiB in the graph's pool, and the eager fallback ran
  # beside that pool (the failed capture's frames held it): out of memory again. The engine now
  # hands the pool back before falling back. First its GPU test; then a million atoms as the
  # plan leaves it (expect: capture fails, eager blocks run), then with expandable segments
  # forced (does the graph's pool fit without the fragmentation of fixed segments?).
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_engine_gpu.py" \
    -k "failed_capture or overflow" > "$OUT/gpu_tests_57.txt" 2>&1
  echo "engine gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_57.txt"))"
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gpu_tests_57.txt" | head
  timeout -k 20 ${LARGE_TIMEOUT:-210} python3 benchmarks/large_cells.py --atoms 1000000 \
    --out "$OUT/million" 2>&1 | grep -E "^\{|Error" | cut -c1-700
  timeout -k 20 ${LARGE_TIMEOUT:-210} python3 benchmarks/large_cells.py --atoms 1000000 \
    --expandable-segments --out "$OUT/million-expandable" 2>&1 | grep -E "^\{|Error" | cut -c1-700
  ;;
58)
  # Issue 31, a million atoms again. Stage 57: the eager fallback after a failed capture still
  # ran out of memory (131 GiB in the graph's pool, with and without expandable segments), and
  # eager blocks grew memory by 64 MiB each (a new CUDA stream per block: cuBLAS's workspace).
  # Now a block whose graph would not fit (1.6 x its eager workspace) is not captured, and one
  # side stream serves every eager block. GPU tests first, then a million atoms as planned.
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_engine_gpu.py" \
    -k "failed_capture or would_not_fit" > "$OUT/gpu_tests_58.txt" 2>&1
  echo "engine gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_58.txt"))"
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gpu_tests_58.txt" | head
  timeout -k 20 ${LARGE_TIMEOUT:-300} python3 benchmarks/large_cells.py --atoms 1000000 \
    --out "$OUT/million" 2>&1 | grep -E "^\{|Error" | cut -c1-1500
  ;;
59)
  # Issue 31, start-up now (the converted model kept in the cache root: a warm start neither
  # converts, checks nor imports mace-torch's trainer): fastmace md at 13,824 atoms, compiled,
  # cold then warm, with -X importtime; then a large cell captured against eager (157,464).
  export FASTMACE_CACHE=/tmp/fastmace-cache-59
  timeout 280 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 130 \
    --importtime --out "$OUT/startup-13824" --extra=--compile > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824 (compiled): exit $?"
  grep -E '"run"|to_first_step|"load_s"|load_read|load_convert|load_check|load_reused|setup_s|first_block' \
    "$OUT/startup-13824.log" | head -30
  grep -h "start-up" "$OUT"/startup-13824/*.log
  timeout -k 20 150 python3 benchmarks/large_cells.py --atoms 157464 --variants default,eager \
    --out "$OUT/eager" 2>&1 | grep -E "^\{|Error" | cut -c1-500
  ;;
60)
  # Stage 59's kept conversion failed on CUDA (a coefficient on the CPU after unpickling), so
  # conversions are kept for CPU runs only. The engine's GPU tests again (stage 58's second
  # test loaded the kept conversion), then start-up at 13,824 atoms, compiled, cold and warm.
  gpu_tests 60 200 "$tests/test_engine_gpu.py" -k "failed_capture or would_not_fit"
  export FASTMACE_CACHE=/tmp/fastmace-cache-60
  compiled_startup 300 140
  python3 -c "import json; [print(r) for r in json.load(open('$OUT/startup-13824/startup_time.json'))['runs']]"
  ;;
61)
  # Kept conversions on CUDA again: cuEquivariance's polynomials unpickle through their
  # constructor (buffers on the CPU), now moved to the device when read. GPU tests (the kept
  # conversion's, the engine's of stage 60), start-up at 13,824 atoms compiled, cold and warm,
  # a third warm run under TORCH_TRACE (where the compilation's warm seconds go), then the
  # uncompiled plan of a 200-step run, cold and warm.
  gpu_tests 61 220 "$tests/test_converted_cache.py" "$tests/test_engine_gpu.py" \
    -k "kept_conversion or failed_capture or would_not_fit"
  export FASTMACE_CACHE=/tmp/fastmace-cache-61
  compiled_startup 230 110
  structure=$(ls "$OUT"/startup-13824/nacl-13824.extxyz)
  TORCH_TRACE=/tmp/trace-61 timeout 90 python3 -m fastmace md "$structure" \
    --model template:mp0-medium --dtype float32 --backend cueq --steps 200 --traj-every 0 \
    --temperature 300 --compile --output /tmp/run-61-trace > "$OUT/traced-warm.log" 2>&1
  echo "traced warm run: exit $?"
  grep -h "start-up" "$OUT/traced-warm.log"
  python3 tools/validation/compile_metrics.py /tmp/trace-61 > "$OUT/compile-metrics-warm.jsonl"
  cut -c1-900 "$OUT/compile-metrics-warm.jsonl"
  FASTMACE_CACHE=/tmp/fastmace-cache-61b \
    timeout 110 python3 benchmarks/startup_time.py --atoms 13824 --steps 200 --timeout-s 50 \
    --out "$OUT/startup-13824-default" > "$OUT/startup-13824-default.log" 2>&1
  echo "start-up 13824 (default plan, 200 steps): exit $?"
  grep -h "start-up" "$OUT"/startup-13824-default/*.log
  ;;
62)
  # AOTInductor's loader crash (stages 45-50): the native backtrace named libstdc++'s own
  # functions (std::codecvt<char16_t>::do_unshift) inside the package's wrapper.so, as if
  # libstdc++ were linked into it statically, with a locale of its own never initialised. How
  # g++ finds libstdc++ here, what the wrapper needs and defines; then the same package linked
  # with -l:libstdc++.so.6 first (aot_inductor.custom_op_libs), loaded in a fresh process.
  timeout 90 python3 tools/validation/kept_conversion_probe.py 2>&1 | grep -v Warn | tail -30
  gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so tools/validation/segv_backtrace.c
  echo "g++ $(g++ -dumpfullversion): libstdc++.so -> $(g++ -print-file-name=libstdc++.so)," \
    "libstdc++.a -> $(g++ -print-file-name=libstdc++.a)"
  export FASTMACE_CACHE=/tmp/fastmace-cache-62 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-62
  export AOT_PROBE_TEMPLATE=mp0-small
  probe=tools/validation/aot_probe2.py
  for variant in default libstdcxx-shared; do
    libs=""; [ "$variant" = libstdcxx-shared ] && libs=":libstdc++.so.6"
    AOT_PROBE_LIBS="$libs" timeout 200 python3 "$probe" aoti-build "/tmp/$variant.pt2" 2>&1 \
      | grep -E "at |rror" | tail -3
    rm -rf "/tmp/$variant" && mkdir -p "/tmp/$variant" && python3 -m zipfile -e "/tmp/$variant.pt2" "/tmp/$variant"
    so=$(find "/tmp/$variant" -name "*.so" | head -1)
    echo "$variant: $(basename "$so"): needs $(readelf -d "$so" | grep NEEDED | grep -o '\[.*\]' | tr '\n' ' ')"
    echo "$variant: defines $(nm -D --defined-only "$so" | grep -c 'St6locale\|codecvt') locale/codecvt symbols"
    LD_PRELOAD=/tmp/segv_backtrace.so timeout 90 python3 "$probe" aoti-load "/tmp/$variant.pt2" \
      > "$OUT/aoti_load_$variant.txt" 2>&1
    echo "$variant: load exit $?"
    grep -E "loaded at|called at|SIGSEGV|Error" "$OUT/aoti_load_$variant.txt" | head -5
  done
  ;;
63)
  # Stage 62: a round trip gave the polynomials' constants in float64 where the conversion
  # had cast them to float32 (now cast again when read), and a package linked with
  # -l:libstdc++.so.6 loaded and ran (3.2e-9 eV/A from eager), but its load took 33.9 s.
  # The kept conversion's GPU test and a warm start; then a package built and loaded twice
  # (the second load after CUDA's JIT cache has the kernels, if that is the time).
  gpu_tests 63 100 "$tests/test_converted_cache.py"
  export FASTMACE_CACHE=/tmp/fastmace-cache-63
  timeout 130 python3 benchmarks/startup_time.py --atoms 13824 --steps 100 --timeout-s 60 \
    --out "$OUT/startup-13824-default" > "$OUT/startup-13824-default.log" 2>&1
  echo "start-up 13824 (default plan, 100 steps): exit $?"
  grep -h "start-up" "$OUT"/startup-13824-default/*.log
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-63 AOT_PROBE_TEMPLATE=mp0-small
  AOT_PROBE_LIBS=":libstdc++.so.6" timeout 150 python3 tools/validation/aot_probe2.py \
    aoti-build /tmp/p.pt2 2>&1 | grep -E "at |rror" | tail -3
  for load in first second; do
    timeout 70 python3 -X importtime tools/validation/aot_probe2.py aoti-load /tmp/p.pt2 \
      > "$OUT/aoti_load_$load.txt" 2>&1
    echo "$load load: exit $?"; grep -E "loaded at|called at|Error" "$OUT/aoti_load_$load.txt"
  done
  ;;
64)
  # The compiled path's start-up with the conversion kept on CUDA (stage 63) and the thermo
  # stress evaluated uncompiled (no second graph after the first step), under TORCH_TRACE for
  # the warm run; then where AOTInductor's 33 s load goes (Python's stack every 5 s).
  gpu_tests 64 150 "$tests/test_converted_cache.py" "$tests/test_engine_gpu.py" \
    -k "kept_conversion or failed_capture or would_not_fit"
  export FASTMACE_CACHE=/tmp/fastmace-cache-64
  TORCH_TRACE=/tmp/trace-64 compiled_startup 230 110
  python3 tools/validation/compile_metrics.py /tmp/trace-64 > "$OUT/compile-metrics.jsonl"
  cut -c1-400 "$OUT/compile-metrics.jsonl"
  # Dynamo's guard-serialising cache refused e3nn's TorchScript before the conversion was kept;
  # which object does it refuse now (twice: the second run would load what the first saved)?
  structure=$(ls "$OUT"/startup-13824/nacl-13824.extxyz)
  for run in save load; do
    TORCH_CACHING_PRECOMPILE=1 timeout 100 python3 -m fastmace md "$structure" \
      --model template:mp0-medium --dtype float32 --backend cueq --steps 100 --traj-every 0 \
      --temperature 300 --compile --output "/tmp/run-64-precompile-$run" \
      > "$OUT/precompile-$run.log" 2>&1
    echo "precompile cache ($run): exit $?"
    grep -hE "start-up|rror|cannot be saved|local scope" "$OUT/precompile-$run.log" | cut -c1-400 | head -6
  done
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-64 AOT_PROBE_TEMPLATE=mp0-small
  timeout 150 python3 tools/validation/aot_probe2.py aoti-build /tmp/p.pt2 2>&1 \
    | grep -E "at |rror" | tail -3
  timeout 80 python3 tools/validation/aot_probe2.py aoti-load /tmp/p.pt2 > "$OUT/aoti_load.txt" 2>&1
  echo "load: exit $?"
  grep -E "loaded at|called at|Error|^  File" "$OUT/aoti_load.txt" | head -60
  ;;
65)
  # Stage 64: AOTInductor's 34 s load was torch.compile's CPU check (cpu_vec_isa: a probe
  # compiled and loaded in a fresh Python per instruction set), now skipped for the load
  # (aot_potential._load). Its archive was lost, so the compiled start-up again, with the
  # steps' lines (a run stalled between steps 40 and 60); then 13,824 atoms through a package
  # and through torch.compile in one process, twice (built, then loaded).
  FASTMACE_CACHE=/tmp/fastmace-cache-65a compiled_startup 200 95
  grep -hE "^step|^done" "$OUT"/startup-13824/warm.log | head -12
  export FASTMACE_CACHE=/tmp/fastmace-cache-65b AOT_PROBE_REPEAT=12
  for run in built loaded; do
    limit=250; [ "$run" = loaded ] && limit=110
    timeout $limit python3 tools/validation/aot_probe2.py compare > "$OUT/compare-$run.txt" 2>&1
    echo "compare ($run): exit $?"
    grep -E "atoms|first call|from eager|Aot|rror" "$OUT/compare-$run.txt" | cut -c1-300 | head -12
  done
  ;;
43)
  # The default path's speed with the package of stage 42 (same cache: loaded, not built),
  # beside the plain cuEq step, in one process; then the GPU tests of the engine and tables.
  export FASTMACE_CACHE=/tmp/fastmace-cache-42 XDG_STATE_HOME=/tmp/fastmace-state-42
  only="mp0-medium/216/fastmace-default,mp0-medium/13824/fastmace-default"
  only="$only,mp0-medium/13824/fastmace-cueq,mp0-medium/1728/fastmace-default"
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/default" --budget-s 300 \
    --case-timeout-s 150 --only "$only" > "$OUT/default.log" 2>&1
  echo "default path: exit $?"
  grep -E "\| (mp0|mh)" "$OUT/default/md_speed.md"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider "$tests/test_radial_table.py" \
    "$tests/test_engine_gpu.py" > "$OUT/gpu_tests_43.txt" 2>&1
  echo "tables and engine gpu tests: exit $? ($(tail -1 "$OUT/gpu_tests_43.txt"))"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_43.txt" | head
  ;;
66)
  # Stage 65: a warm compiled start failed in Dynamo's guards (an unpickled readout never
  # registered e3nn's Activation for simplify; fixed, test_compile_kept_conversion.py), and the
  # package still took 33.7 s to load (torch's other ISA probes; the loader is now made
  # directly). The compiled start-up cold and warm, through torch.compile and then through a
  # package compiled ahead of time (built cold, loaded warm).
  FASTMACE_CACHE=/tmp/fastmace-cache-66a compiled_startup 200 110
  grep -hE "^step|^done" "$OUT"/startup-13824/warm.log | head -12
  FASTMACE_CACHE=/tmp/fastmace-cache-66b aot_startup 330 280
  ;;
67)
  # Stage 66's first half, for the device time left: the compiled start-up cold and warm
  # through torch.compile, with the warm start's Dynamo failure fixed.
  FASTMACE_CACHE=/tmp/fastmace-cache-67 compiled_startup 190 110
  grep -hE "^step|^done" "$OUT"/startup-13824/warm.log | head -12
  ;;
68)
  # Stage 67: after two list regrowths a compiled run stalled 33 s, and stage 64's metrics had
  # a second compilation of the model's frame. Which guard failed, and what each part of the
  # warm model phase (9.2 s) is: imports or unpickling.
  export FASTMACE_CACHE=/tmp/fastmace-cache-68
  compiled_startup 200 120
  structure=$(ls "$OUT"/startup-13824/nacl-13824.extxyz)
  TORCH_LOGS=recompiles,graph_breaks timeout 120 python3 -X importtime -m fastmace md \
    "$structure" --model template:mp0-medium --dtype float32 --backend cueq --steps 200 \
    --traj-every 0 --temperature 300 --compile --output /tmp/run-68 > "$OUT/recompiles.log" 2>&1
  echo "logged warm run: exit $?"
  grep -vE "^import time" "$OUT/recompiles.log" | grep -iE "recompil|guard|break|start-up" | cut -c1-400 | head -20
  grep -E "^import time" "$OUT/recompiles.log" | sort -t'|' -k2 -n | tail -12
  ;;
69)
  # Issue 30's product basis (dynamics/product_basis.py, product_triton.py), tested only in
  # Triton's interpreter so far: its GPU test (kernels compiled against the torch formulas, a
  # Potential against mace-torch), then each block against cuEquivariance's on the same inputs
  # and the whole potential with either, captured, at three sizes.
  gpu_tests 69 150 "$tests/test_product_basis.py"
  timeout 300 python3 benchmarks/product_kernels.py --atoms 216,1728,13824 \
    --out "$OUT/product" > "$OUT/product_kernels.log" 2>&1
  echo "product kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/product_kernels.log"
  ;;
70)
  # Issue 32 (one engine builder, fm.md and Simulation in stages, the ensemble catalog) must
  # leave behaviour and speed unchanged: every GPU test but the product basis' (stage 69) and
  # POLAR-1's, then the default path at 13,824 and 216 atoms on .baseline (bb844a3, before the
  # issue) and on this checkout, in one process each.
  gpu_tests 70 330 "$tests/test_converted_cache.py" "$tests/test_dispersion_triton.py" \
    "$tests/test_edge_chunks.py" "$tests/test_engine_gpu.py" "$tests/test_engine_settings.py" \
    "$tests/test_fused_conv.py" "$tests/test_gpu_name.py" "$tests/test_integrators.py" \
    "$tests/test_md_environment.py" "$tests/test_neighbours.py" "$tests/test_pair_radials.py" \
    "$tests/test_potential.py" "$tests/test_quiet_run.py" "$tests/test_radial_table.py" \
    "$tests/test_relax.py" "$tests/test_spread.py"
  speed_before_after 110 100 90 "mp0-medium/13824/fastmace-default,mp0-medium/216/fastmace-default"
  ;;
71)
  # Stage 70's before/after skipped both cases (each needs about 115 s of md_speed's budget),
  # and stage 69's GPU test passed edges on the CPU: the test again, then 13,824 atoms alone,
  # before and after, with the time it needs.
  gpu_tests 71 120 "$tests/test_product_basis.py"
  speed_before_after 200 190 180 "mp0-medium/13824/fastmace-default"
  ;;
72)
  # Stage 68: a regrown list recompiled the model (13 s) because the number of padding nodes
  # followed the edge capacity; it now follows the atoms. The compiled start-up cold and warm,
  # with Dynamo's recompilations logged.
  export FASTMACE_CACHE=/tmp/fastmace-cache-72 TORCH_LOGS=recompiles
  compiled_startup 200 120
  grep -hE "^step|^done" "$OUT"/startup-13824/warm.log | head -12
  echo "recompilations: $(grep -hc "Recompiling function" "$OUT"/startup-13824/*.log | tr '\n' ' ')"
  ;;
73)
  # Stage 69: the generated product-basis kernels took 2.4x cuEquivariance's time; a 32-channel
  # program ran on four warps (each value computed four times). Now a tile of 128 values on
  # four warps, float32 coefficients as literals: against cuEquivariance's. Then stage 70's
  # five failures again, with tools/validation/gpu_extra_wheels.sh's wheels this time (D3's
  # torch-dftd, the CUDA headers the hybrid backend builds with), and one compiled run at
  # 13,824 atoms with Dynamo's recompilations logged (padding nodes now counted from atoms).
  product_kernels 120 1728,13824
  gpu_tests 73 150 "$tests/test_dispersion_triton.py" "$tests/test_engine_gpu.py" \
    "$tests/test_quiet_run.py" -k "hybrid or fused or triton"
  python3 -c "import ase.build, ase.io; ase.io.write('/tmp/nacl.extxyz', \
ase.build.bulk('NaCl', 'rocksalt', a=5.64, cubic=True).repeat((12, 12, 12)))"
  FASTMACE_CACHE=/tmp/fastmace-cache-73 TORCH_LOGS=recompiles timeout 150 python3 -m fastmace \
    md /tmp/nacl.extxyz --model template:mp0-medium --dtype float32 --backend cueq \
    --steps 300 --traj-every 0 --temperature 300 --compile --output /tmp/run-73 \
    > "$OUT/compiled-run.log" 2>&1
  echo "compiled run: exit $?; recompilations: $(grep -c "Recompiling function" \
"$OUT/compiled-run.log"); regrowths: $(grep -ci "regrow" "$OUT/compiled-run.log")"
  grep -E "start-up|^done|Recompil|guard fail" "$OUT/compiled-run.log" | cut -c1-300 | head
  ;;
74)
  # Stage 73's first part alone, for the device time left (about two minutes): the product
  # basis' kernels on tiles of 128 values against cuEquivariance's, at 13,824 atoms.
  product_kernels 110 13824
  ;;
75)
  # Issue 30: the convolution's kernels generated per coupling (conv_codegen.py: only T's
  # nonzero entries, one channel per thread), tested in the interpreter only: their GPU test
  # (compiled against the torch formulas, a Potential against mace-torch), then each block
  # against cuEquivariance's fused convolution on the same inputs, and the whole potential
  # with either, captured (stage 46 measured the first version: 11x slower backward).
  gpu_tests 75 150 "$tests/test_fused_conv.py"
  timeout 240 python3 benchmarks/conv_kernels.py --atoms 1728,13824 --out "$OUT/conv" \
    > "$OUT/conv_kernels.log" 2>&1
  echo "convolution kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/conv_kernels.log"
  ;;
76)
  # Issue 30's BF16 tier (matmul_precision="bf16": the linear layers as GEMMs on BF16 tensor
  # cores with float32 sums): its tests, its forces against float64 on the GPU (as measured
  # on the CPU in docs/validation/bf16.md), then its speed beside float32's, plain and on the
  # fast path (tables and compile), in one md_speed run.
  gpu_tests 76 100 "$tests/test_irreps_linear.py"
  timeout 140 python3 tools/validation/bf16_accuracy.py --device cuda \
    --models tiny@cueq,mp0-medium@cueq,mh-1@cueq --out "$OUT/bf16-accuracy-gpu.json" \
    > "$OUT/bf16-accuracy.log" 2>&1
  echo "bf16 accuracy: exit $?"; grep -E "float32|bf16" "$OUT/bf16-accuracy.log" | cut -c1-160
  timeout 230 python3 benchmarks/md_speed.py --out "$OUT/bf16-speed" --budget-s 200 \
    --case-timeout-s 100 --only "mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-bf16,\
mp0-medium/13824/fastmace-cueq-table-compile,mp0-medium/13824/fastmace-cueq-bf16-table-compile" \
    > "$OUT/bf16-speed.log" 2>&1
  echo "bf16 speed: exit $?"; grep -E "ms/step|bf16" "$OUT/bf16-speed.log" | tail -8
  ;;
77)
  # Issue 31: the warm start through a package compiled ahead of time on CUDA (stage 66's
  # second half): built in the cold run (201 s at 13,824 atoms in stage 65), loaded in the
  # warm one. Its first try (H100) stopped at export, "Constraints violated (atoms)": the
  # padding nodes were counted inside the graph with max(1, ...); they are now a size of their
  # own (aot_potential._inputs). Then stage 70's five failures again with
  # tools/validation/gpu_extra_wheels.sh's wheels (D3's torch-dftd, the CUDA headers the
  # hybrid backend builds with).
  FASTMACE_CACHE=/tmp/fastmace-cache-77 aot_startup 360 300
  gpu_tests 77 240 "$tests/test_dispersion_triton.py" "$tests/test_engine_gpu.py" \
    "$tests/test_quiet_run.py" -k "hybrid or fused or triton"
  ;;
78)
  # Stage 75 (the generated convolution kernels against cuEquivariance's), then the tiled
  # product basis against cuEquivariance's at 13,824 atoms (stage 74; 110 s were too few on a
  # freshly started H100).
  gpu_tests 78 120 "$tests/test_fused_conv.py"
  timeout 230 python3 benchmarks/conv_kernels.py --atoms 1728,13824 --out "$OUT/conv" \
    > "$OUT/conv_kernels.log" 2>&1
  echo "convolution kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/conv_kernels.log" | cut -c1-200
  product_kernels 150 13824
  ;;
79)
  # What stage 78 left (H100): 13,824 atoms ran out of memory in the float64 reference (now
  # taken in chunks of edges). The kernels are also timed alone with other launches
  # (conv_kernels.launch_cases: programs of one warp or four, 1 to 8 edges per iteration), at
  # 1,728 and 13,824 atoms.
  timeout 420 python3 benchmarks/conv_kernels.py --atoms 1728,13824 --out "$OUT/conv" \
    > "$OUT/conv_kernels.log" 2>&1
  echo "convolution kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/conv_kernels.log" | cut -c1-200
  ;;
80)
  # The convolution's GPU test (it ran out of 120 s in stage 78: many kernels generated and
  # compiled per coupling and dtype on a fresh machine), then stage 77's five GPU tests, which
  # close issue 32's before-and-after.
  gpu_tests 80a 280 "$tests/test_fused_conv.py"
  gpu_tests 80 240 "$tests/test_dispersion_triton.py" "$tests/test_engine_gpu.py" \
    "$tests/test_quiet_run.py" -k "hybrid or fused or triton"
  ;;
81)
  # Issue 31: should a compiled run on CUDA load a package compiled ahead of time rather than
  # trace with torch.compile? Stage 66 again, both paths in one command on one machine (stages
  # 67 and 77 each ran one half, on different machines): the compiled start-up cold and warm
  # through torch.compile, then through a package (built cold, loaded warm), 200 steps each.
  FASTMACE_CACHE=/tmp/fastmace-cache-81a compiled_startup 190 120
  FASTMACE_CACHE=/tmp/fastmace-cache-81b aot_startup 380 300
  ;;
82)
  # Issue 31: a million atoms' set-up with the structure check's cell list (stage 58: 74.2 s
  # to the end of the first block, about 42 s of it outside the potential, the list and the
  # first forces; the check's ASE search took 46.6 s of that on the development machine).
  # H200 only: the run peaks at 97.8 GiB.
  timeout -k 20 ${LARGE_TIMEOUT:-400} python3 benchmarks/large_cells.py --atoms 1000000 \
    --out "$OUT/million" 2>&1 | grep -E "^\{|Error" | cut -c1-1500
  ;;
83)
  # Stage 79 chose one-warp programs (conv_triton.THREADS = 32): the kernels with the new
  # default, alone and in the whole potential, against cuEquivariance's. Then stage 76's two
  # misses: the BF16 GPU test (its ASE edges were left on the CPU) and BF16's speed beside
  # float32's (its cases were missing from md_speed's plan).
  timeout 200 python3 benchmarks/conv_kernels.py --atoms 1728,13824 --out "$OUT/conv" \
    > "$OUT/conv_kernels.log" 2>&1
  echo "convolution kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/conv_kernels.log" | cut -c1-110
  gpu_tests 83 100 "$tests/test_irreps_linear.py"
  timeout 230 python3 benchmarks/md_speed.py --out "$OUT/bf16-speed" --budget-s 200 \
    --case-timeout-s 100 --only "mp0-medium/13824/fastmace-cueq,mp0-medium/13824/fastmace-cueq-bf16,\
mp0-medium/13824/fastmace-cueq-table-compile,mp0-medium/13824/fastmace-cueq-bf16-table-compile" \
    > "$OUT/bf16-speed.log" 2>&1
  echo "bf16 speed: exit $?"; grep -E "ms/step" "$OUT/bf16-speed.log" | tail -8
  ;;
84)
  # Issue 30: with one-warp programs our convolution's whole potential beat cuEquivariance's
  # at 13,824 atoms (stage 83, kernel time). MD steps with it, beside cuEquivariance's, with
  # tables, eager and compiled, at 13,824 and 1,728 atoms.
  timeout 400 python3 benchmarks/md_speed.py --out "$OUT/conv-speed" --budget-s 370 \
    --case-timeout-s 120 --only "mp0-medium/13824/fastmace-cueq-table,\
mp0-medium/13824/fastmace-cueq-conv-table,mp0-medium/13824/fastmace-cueq-table-compile,\
mp0-medium/13824/fastmace-cueq-conv-table-compile,mp0-medium/1728/fastmace-cueq-table-compile,\
mp0-medium/1728/fastmace-cueq-conv-table-compile" > "$OUT/conv-speed.log" 2>&1
  echo "conv speed: exit $?"; grep -E "ms/step|Error|error" "$OUT/conv-speed.log" | tail -12
  ;;
85)
  # Stage 84: our convolution made a compiled step 1.41x faster at 13,824 atoms and 0.87x as
  # fast at 1,728. Where it starts to pay, and how it scales: 4,096, 8,000 and 32,768 atoms.
  timeout 320 python3 benchmarks/md_speed.py --out "$OUT/conv-sizes" --budget-s 290 \
    --case-timeout-s 120 --only "/4096/fastmace-cueq-table-compile,\
/4096/fastmace-cueq-conv-table-compile,/8000/fastmace-cueq-table-compile,\
/8000/fastmace-cueq-conv-table-compile,/32768/fastmace-cueq-table-compile,\
/32768/fastmace-cueq-conv-table-compile" > "$OUT/conv-sizes.log" 2>&1
  echo "conv sizes: exit $?"; grep -E "ms/step|Error|error" "$OUT/conv-sizes.log" | tail -12
  ;;
86)
  # Issues 30 and 31: the planner now chooses FastMACE's convolution (with tables, from 3,000
  # atoms, where the run's saving pays for its kernels' compilation). fm.md's plan with no
  # options at 13,824 atoms, for 100,000 steps: the default path. Before it, the convolution
  # with each atom's runs found once per block (edge_runs) against stage 84's 4.33 and 15.0 ms.
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/default" --budget-s 300 \
    --case-timeout-s 170 --only "mp0-medium/1728/fastmace-cueq-conv-table-compile,\
mp0-medium/13824/fastmace-cueq-conv-table-compile,mp0-medium/13824/fastmace-default" \
    > "$OUT/default.log" 2>&1
  echo "default: exit $?"; grep -E "ms/step|Error|error|convolution" "$OUT/default.log" | tail -8
  ;;
87)
  # Issues 30 and 31's targets tables (H200): fm.md's plan with no options (the default path,
  # now with FastMACE's convolution from 3,000 atoms) at the issue's sizes, MP-0 medium and
  # MH-1 (what a user gets is what counts), in one md_speed run.
  timeout 560 python3 benchmarks/md_speed.py --out "$OUT/targets" --budget-s 520 \
    --case-timeout-s 170 --only "mp0-medium/216/fastmace-default,mp0-medium/1728/fastmace-default,\
mp0-medium/13824/fastmace-default,mp0-medium/32768/fastmace-default,mh-1/216/fastmace-default,\
mh-1/1728/fastmace-default" > "$OUT/targets.log" 2>&1
  echo "targets: exit $?"; grep -E "ms/step|Error|error" "$OUT/targets.log" | tail -10
  ;;
88)
  # Stage 87 left out MH-1 (md_speed's plan had no MH-1 default case). MH-1's default path,
  # and beside the default path cuEquivariance's best forced path (tables, compile, no own
  # convolution) and mace-torch's calculator with cuEq, in one run.
  timeout 560 python3 benchmarks/md_speed.py --out "$OUT/targets" --budget-s 520 \
    --case-timeout-s 170 --only "mh-1/216/fastmace-default,mh-1/1728/fastmace-default,\
mp0-medium/216/fastmace-cueq-table-compile,mp0-medium/1728/fastmace-cueq-table-compile,\
mp0-medium/13824/fastmace-cueq-table-compile,mp0-medium/32768/fastmace-cueq-table-compile,\
mp0-medium/1728/ase-cueq,mp0-medium/13824/ase-cueq" > "$OUT/targets.log" 2>&1
  echo "targets: exit $?"; grep -E "ms/step|Error|error" "$OUT/targets.log" | tail -10
  ;;
89)
  # Where the default path's time goes now (kernel tables of two replayed blocks): MH-1 at 216
  # and 1,728 atoms (3.22 and 14.6 ms/step on an H100 against targets of 1.6 and 6), MP-0
  # medium at 216 and 13,824. Then where a warm compiled start's 20.5 s go (stage 81), under
  # cProfile and -X importtime, cold run first to fill the cache.
  timeout 250 python3 benchmarks/md_speed.py --out "$OUT/profile" --budget-s 230 --profile \
    --case-timeout-s 100 --only "mh-1/216/fastmace-default,mh-1/1728/fastmace-default,\
mp0-medium/216/fastmace-default,mp0-medium/13824/fastmace-default" > "$OUT/profile.log" 2>&1
  echo "profile: exit $?"; grep -E "ms/step|Error|error" "$OUT/profile.log" | tail -6
  FASTMACE_CACHE=/tmp/fastmace-cache-89 timeout 320 python3 benchmarks/startup_time.py \
    --atoms 13824 --steps 200 --timeout-s 200 --profile --importtime --out "$OUT/startup-13824" \
    --extra=--compile > "$OUT/startup-13824.log" 2>&1
  echo "start-up 13824 (compiled, profiled): exit $?"
  grep -h "start-up" "$OUT"/startup-13824/*.log
  ;;
90)
  # Issue 30: MH-1's radial MLPs were 8.2 of 14.8 ms per step at 1,728 atoms (stage 89). Now
  # tabulated per pair of elements (dynamics/pair_table.py) and chosen by default: the GPU
  # tests, then MH-1's default path beside its compiled MLPs (the previous default), profiled.
  gpu_tests 90 150 "$tests/test_pair_table.py" "$tests/test_radial_table.py"
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/mh1" --budget-s 300 --profile \
    --case-timeout-s 120 --only "mh-1/216/fastmace-default,mh-1/1728/fastmace-default,\
mh-1/216/fastmace-cueq-compile,mh-1/1728/fastmace-cueq-compile" > "$OUT/mh1.log" 2>&1
  echo "mh-1: exit $?"; grep -E "ms/step|Error|error|     [0-9.]+ ms" "$OUT/mh1.log" | tail -40
  ;;
91)
  # Stage 90's default cases failed building the tables (a float64 copy of cuEquivariance's
  # element embedding ran on two devices; the block's own embedding now serves): again.
  timeout 250 python3 benchmarks/md_speed.py --out "$OUT/mh1" --budget-s 230 --profile \
    --case-timeout-s 110 --only "mh-1/216/fastmace-default,mh-1/1728/fastmace-default" \
    > "$OUT/mh1.log" 2>&1
  echo "mh-1: exit $?"; grep -E "ms/step|Error|error|     [0-9.]+ ms" "$OUT/mh1.log" | tail -40
  ;;
92)
  # With pair tables MH-1 gets FastMACE's convolution by default from 3,000 atoms (the
  # planner's rule was fitted on MP-0): does MH-1's default path at 13,824 atoms run, and at
  # what speed (the last minutes of a session's device time).
  timeout 200 python3 benchmarks/md_speed.py --out "$OUT/mh1-large" --budget-s 190 \
    --case-timeout-s 185 --only "mh-1/13824/fastmace-default" > "$OUT/mh1-large.log" 2>&1
  echo "mh-1 13824: exit $?"; grep -E "ms/step|Error|error|Warning" "$OUT/mh1-large.log" | tail
  ;;
93)
  # Issue 30's "Done when" (H200): the targets table in one recorded run, every default-path
  # row beside cuEquivariance's best path without FastMACE's kernels (MP-0: tables and compile;
  # MH-1: compile, its MLPs as trained). The defaults first: the budget stops new cases.
  timeout 590 python3 benchmarks/md_speed.py --out "$OUT/targets" --budget-s 540 \
    --case-timeout-s 170 --only "mp0-medium/216/fastmace-default,mp0-medium/1728/fastmace-default,\
mp0-medium/13824/fastmace-default,mp0-medium/32768/fastmace-default,mh-1/216/fastmace-default,\
mh-1/1728/fastmace-default,mp0-medium/216/fastmace-cueq-table-compile,\
mp0-medium/1728/fastmace-cueq-table-compile,mp0-medium/13824/fastmace-cueq-table-compile,\
mp0-medium/32768/fastmace-cueq-table-compile,mh-1/216/fastmace-cueq-compile,\
mh-1/1728/fastmace-cueq-compile" > "$OUT/targets.log" 2>&1
  echo "targets: exit $?"; grep -E "ms/step|Error|error" "$OUT/targets.log" | tail -14
  ;;
94)
  # The kernel rows of issue 30's table (H200): the convolution and the product basis, forward
  # and backward at 13,824 atoms, ours against cuEquivariance's on the same inputs.
  timeout 250 python3 benchmarks/conv_kernels.py --atoms 13824 --out "$OUT/conv" \
    > "$OUT/conv_kernels.log" 2>&1
  echo "convolution kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/conv_kernels.log" | cut -c1-110
  product_kernels 250 13824
  ;;
95)
  # MH-1's pair tables read inside FastMACE's convolution (table_conv.py with start rows):
  # the GPU tests, then MH-1 with the tables apart and inside, compiled, at 1,728 atoms (what
  # fits the 12 device minutes left on 2026-12-06; 13,824 atoms is the next run's).
  gpu_tests 95 150 "$tests/test_pair_table.py" "$tests/test_fused_conv.py"
  timeout 300 python3 benchmarks/md_speed.py --out "$OUT/mh1-conv" --budget-s 260 \
    --case-timeout-s 150 --only "mh-1/1728/fastmace-cueq-table-compile,\
mh-1/1728/fastmace-cueq-conv-table-compile" > "$OUT/mh1-conv.log" 2>&1
  echo "mh-1 conv: exit $?"; grep -E "ms/step|Error|error" "$OUT/mh1-conv.log" | tail -8
  ;;
96)
  # The step's own arithmetic fused by Inductor where the model is compiled (dynamics/fusion.py):
  # the default path with and without it, profiled (launches per step), at the sizes where
  # launches count (MP-0 medium 216 and 1,728, MH-1 216), then the CPU fusion tests on CUDA's
  # machine.
  timeout 420 python3 benchmarks/md_speed.py --out "$OUT/fusion" --budget-s 400 --profile \
    --case-timeout-s 110 --only "mp0-medium/216/fastmace-default,\
mp0-medium/216/fastmace-default-unfused,mp0-medium/1728/fastmace-default,\
mp0-medium/1728/fastmace-default-unfused,mh-1/216/fastmace-default,mh-1/216/fastmace-default-unfused" \
    > "$OUT/fusion.log" 2>&1
  echo "fusion: exit $?"; grep -E "ms/step|Error|error|fused|      [0-9.]+ ms" "$OUT/fusion.log" | tail -60
  ;;
97)
  # The potential's own arithmetic fused too (edge vectors, padding, node inputs, energies,
  # forces, stresses: dynamics/potential.py's fusible parts), default path with and without
  # fusion at 216 atoms, profiled (stage 96 on an H100: 1.07 fused, 1.34 unfused, 74.4
  # element-wise launches per step); then MH-1 at 1,728 atoms with its pair tables apart and
  # inside FastMACE's convolution (stage 95's benchmark, which checks the first state).
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/fusion" --budget-s 290 --profile \
    --case-timeout-s 120 --only "mp0-medium/216/fastmace-default,\
mp0-medium/216/fastmace-default-unfused,mh-1/216/fastmace-default,\
mh-1/1728/fastmace-cueq-table-compile,mh-1/1728/fastmace-cueq-conv-table-compile" \
    > "$OUT/fusion.log" 2>&1
  echo "fusion: exit $?"; grep -E "ms/step|Error|error|      [0-9.]+ ms" "$OUT/fusion.log" | tail -60
  ;;
98)
  # Stage 97's first two cases alone (what the last 4 device minutes hold): the default path
  # with the potential's arithmetic fused as well, against the same run unfused, at 216 atoms.
  # (md_speed skips a case it estimates will not fit: the budget must exceed the case timeout
  # by about 20 s.) Run on an H200 on 2026-12-06: 0.922 fused, 1.21 unfused.
  timeout 175 python3 benchmarks/md_speed.py --out "$OUT/fusion" --budget-s 170 --profile \
    --case-timeout-s 70 --only "mp0-medium/216/fastmace-default,\
mp0-medium/216/fastmace-default-unfused" > "$OUT/fusion.log" 2>&1
  echo "fusion: exit $?"; grep -E "ms/step|Error|error|      [0-9.]+ ms" "$OUT/fusion.log" | tail -30
  ;;
99)
  # Issue 30: cuEquivariance's linear layers as one batched GEMM per shape of their matrices
  # (dynamics/stacked_linear.py), the cases stage 105 left: MH-1 (512-wide linear layers) at
  # 216 atoms and MP-0 medium at 13,824, default path before (.baseline: e65a94b) and after,
  # profiled, in two md_speed processes one after the other (md_speed skips a case it
  # predicts will not fit: each needs about 120 s here). Make .baseline first and carry it:
  #   mkdir -p .baseline && git archive e65a94b packages/fastmace/src benchmarks | tar -x -C .baseline
  profiled_before_after 280 270 130 "mh-1/216/fastmace-default,mp0-medium/13824/fastmace-default"
  ;;
100)
  # Stage 99 cut to what 8 device minutes hold: the default path at 216 atoms, MP-0 medium and
  # MH-1, before (.baseline: e65a94b) and after the stacked linear layers, profiled.
  profiled_before_after 160 150 65 "mp0-medium/216/fastmace-default,mh-1/216/fastmace-default"
  ;;
101)
  # Stage 100 cut to the one case 5 device minutes hold: MP-0 medium's default path at 216
  # atoms before (.baseline: e65a94b) and after the stacked linear layers, profiled.
  profiled_before_after 105 100 75 "mp0-medium/216/fastmace-default"
  ;;
102)
  # Stage 101, then the convolution's own kernels within fewer registers a thread (ptxas
  # fills what it may: MP-0 medium's second-block backward from the table takes 246 unbounded,
  # eight one-warp programs per SM; tools/validation/kernel_registers.py) at 13,824 atoms,
  # reading per-pair weights and the table, both blocks.
  profiled_before_after 105 100 75 "mp0-medium/216/fastmace-default"
  timeout 230 python3 benchmarks/conv_kernels.py --atoms 13824 --launches-only \
    --out "$OUT/registers" > "$OUT/registers.log" 2>&1
  echo "register caps: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/registers.log" | cut -c1-120
  ;;
104)
  # Why stage 102's "after" (and 103, the same command with 135 s a case) timed no block: the
  # stacked layers against cuEquivariance's, forces (eager and compiled), then a captured MD
  # run block by block (redone? launched how? capture failure?). Run on an H100 on 2026-12-07
  # at 399ab5b: every block of the stacked run went uncaptured (a host-to-device copy of the
  # stacked layers' column indices, refused inside a capture; fixed since).
  timeout 120 python3 tools/validation/stacked_check.py --atoms 216 2>&1 | grep -v -i warn
  timeout 200 python3 tools/validation/stacked_md.py --atoms 216 --blocks 8 2>&1 | grep -v -i warn
  ;;
105)
  # The stacked linear layers' before (.baseline: e65a94b) and after at 216 atoms, MP-0
  # medium's default path, profiled (H100, 2026-12-07, with the fix: 0.996 and 0.845 ms).
  profiled_before_after 135 125 105 "mp0-medium/216/fastmace-default"
  ;;
106)
  # The convolution's kernels with each step loading the next edges' indices ahead
  # (conv_codegen's PREFETCH), with and without room for 128 registers, at 13,824 and 1,728
  # atoms, reading per-pair weights and the table; then the GPU tests of the kernels (their
  # launches include prefetching ones) and of the stacked layers' capture.
  timeout 300 python3 benchmarks/conv_kernels.py --atoms 13824,1728 --launches-only \
    --out "$OUT/prefetch" > "$OUT/prefetch.log" 2>&1
  echo "prefetch: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/prefetch.log" | cut -c1-130
  gpu_tests 106 200 "$tests/test_fused_conv.py" "$tests/test_stacked_linear.py"
  # Run on an H200 on 2026-12-07: prefetching helped only the second block reading per-pair
  # weights (5.72 to 5.21 ms at 13,824 atoms) and cost the table's kernels, which the default
  # path runs (5.65 to 6.18), so PREFETCH stays off. The GPU tests ran out of their 200 s.
  ;;
107)
  # Stage 93's cuEquivariance rows for MP-0 medium (tables and compile, no own kernels), which
  # its budget left out, then the GPU tests of the stacked layers and the convolution with
  # more time (H200, 2026-12-07: 0.804, 2.93, 18.4 and 40.8 ms; the tests ran out of 200 s).
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/cueq" --budget-s 320 \
    --case-timeout-s 120 --only "mp0-medium/216/fastmace-cueq-table-compile,\
mp0-medium/13824/fastmace-cueq-table-compile,mp0-medium/1728/fastmace-cueq-table-compile,\
mp0-medium/32768/fastmace-cueq-table-compile" > "$OUT/cueq.log" 2>&1
  echo "cueq: exit $?"; grep -E "ms/step|Error|error" "$OUT/cueq.log" | tail -8
  gpu_tests 107 400 "$tests/test_stacked_linear.py" "$tests/test_fused_conv.py"
  ;;
108)
  # Issue 31's million atoms with today's default path (stage 58, 2026-12-04: 74.2 s to the
  # first block, 2.53 us an atom-step, before the structure check's cell list, FastMACE's
  # convolution and the stacked layers). H200 only: stage 58 peaked at 97.8 GiB. Then stage
  # 112's launches of the convolution, on the H200.
  timeout -k 20 300 python3 benchmarks/large_cells.py --atoms 1000000 \
    --out "$OUT/million" 2>&1 | grep -E "^\{|Error" | cut -c1-1500
  timeout 150 python3 benchmarks/conv_kernels.py --atoms 13824 --launches-only \
    --out "$OUT/launches" > "$OUT/launches.log" 2>&1
  echo "launches: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/launches.log" | cut -c1-130
  ;;
109)
  # Issue 30's convolution row at 13,824 atoms (ours against cuEquivariance's, same inputs),
  # then the GPU tests of the convolution and the stacked layers, which ran out of 200 s twice.
  timeout 230 python3 benchmarks/conv_kernels.py --atoms 13824 --out "$OUT/conv" \
    > "$OUT/conv_kernels.log" 2>&1
  echo "convolution kernels: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/conv_kernels.log" | cut -c1-110
  gpu_tests 109 340 "$tests/test_fused_conv.py" "$tests/test_stacked_linear.py"
  ;;
110)
  # The convolution's programs of one warp taking 64 channels, two a thread (stage 109 on an
  # H100: every kernel 5-10 % faster than one channel a thread), in the default path at
  # 13,824 atoms: before (.baseline: the commit before) and after, profiled.
  profiled_before_after 280 270 130 "mp0-medium/13824/fastmace-default"
  ;;
111)
  # From stage 110's launch (one warp, 64 channels; H100: 14.4 to 13.5 ms a step at 13,824
  # atoms): four channels a thread, an atom's 128 channels on two warps, two edges a step.
  timeout 250 python3 benchmarks/conv_kernels.py --atoms 13824 --launches-only \
    --out "$OUT/launches" > "$OUT/launches.log" 2>&1
  echo "launches: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/launches.log" | cut -c1-130
  ;;
112)
  # The two-channel programs with room for 192 and 160 registers and prefetching; then where
  # FastMACE's convolution starts to pay with them (the planner takes it from 3,000 atoms,
  # drawn when it was 0.87x cuEquivariance's at 1,728), and the default path at 13,824 with
  # two edges a step in the first block.
  timeout 200 python3 benchmarks/conv_kernels.py --atoms 13824 --launches-only \
    --out "$OUT/launches" > "$OUT/launches.log" 2>&1
  echo "launches: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/launches.log" | cut -c1-130
  timeout 330 python3 benchmarks/md_speed.py --out "$OUT/crossover" --budget-s 320 \
    --case-timeout-s 100 --only "mp0-medium/13824/fastmace-default,\
mp0-medium/1728/fastmace-cueq-table-compile,mp0-medium/1728/fastmace-cueq-conv-table-compile,\
mp0-medium/4096/fastmace-cueq-table-compile,mp0-medium/4096/fastmace-cueq-conv-table-compile" \
    > "$OUT/crossover.log" 2>&1
  echo "crossover: exit $?"; grep -E "ms/step|Error|error" "$OUT/crossover.log" | tail -8
  ;;
113)
  # Stage 112 for a session with few device minutes: where FastMACE's convolution starts to pay
  # (1,728 atoms, with and without it, both compiled with tables), then the launches.
  timeout 210 python3 benchmarks/md_speed.py --out "$OUT/crossover" --budget-s 200 \
    --case-timeout-s 100 --only "mp0-medium/1728/fastmace-cueq-table-compile,\
mp0-medium/1728/fastmace-cueq-conv-table-compile" > "$OUT/crossover.log" 2>&1
  echo "crossover: exit $?"; grep -E "ms/step|Error|error" "$OUT/crossover.log" | tail -8
  timeout 150 python3 benchmarks/conv_kernels.py --atoms 13824 --launches-only \
    --out "$OUT/launches" > "$OUT/launches.log" 2>&1
  echo "launches: exit $?"
  grep -E "^ +[0-9]+ " "$OUT/launches.log" | cut -c1-130
  ;;
114)
  # The default path with the two-channel launch and the first block's two-edge step (run on
  # 2026-12-07 by hand with these arguments, straight after stage 113 on the same machine, the
  # cache root left at its default rather than this script's FASTMACE_CACHE).
  timeout 320 python3 benchmarks/md_speed.py --out "$OUT/default13824" --budget-s 300 \
    --case-timeout-s 150 --only "mp0-medium/13824/fastmace-default,mp0-medium/216/fastmace-default" \
    > "$OUT/default.log" 2>&1
  echo "exit $?"; grep -E "ms/step|Error|error" "$OUT/default.log" | tail -6
  ;;
115)
  # MH-1's default path at 216 atoms (after stage 114, the device time left).
  timeout 190 python3 benchmarks/md_speed.py --out "$OUT/mh1" --budget-s 180 \
    --case-timeout-s 170 --only "mh-1/216/fastmace-default" > "$OUT/mh1.log" 2>&1
  echo "exit $?"; grep -E "ms/step|Error|error" "$OUT/mh1.log" | tail -4
  ;;
116)
  # Issue 31's warm start on today's default path at 13,824 atoms (tables, FastMACE's
  # convolution, the stacked layers, compile): cold, warm, then warm again under cProfile and
  # -X importtime (where the warm start goes; stage 81, before these parts: 20.5 s warm, 8.4
  # of it compilation).
  default_startup 420 200 startup-13824 --profile-warm
  head -30 "$OUT/startup-13824/warm-profiled-top.txt" 2>/dev/null | cut -c1-160
  ;;
117)
  # Where stage 116's warm start goes (31.9 s, of which a first block of 11.9 s that compiled
  # for 7.6 s): the same three runs with the warm profile kept whole (warm-profiled.pstats),
  # then two more warm starts on the same cache, one with Inductor's compile workers off
  # (TORCHINDUCTOR_COMPILE_THREADS=1: no worker pool to start for kernels already compiled).
  default_startup 330 150 startup-13824 --profile-warm
  mv "$OUT/startup-13824/warm-profiled.prof" "$OUT/startup-13824/warm-profiled.pstats"
  TORCHINDUCTOR_COMPILE_THREADS=1 default_startup 150 70 startup-13824-one-thread
  ;;
118)
  # The planner's compile_workers on the GPU (dynamics/compile_workers.py): stage 116 again,
  # where the warm run now compiles with one Inductor worker because the cold run recorded its
  # compilation (stage 117: 28.8 s warm with the pool, 23.1-23.4 s with the environment's one
  # worker for the whole process). The plan's "workers" line says it applied.
  default_startup 300 150 startup-13824
  ;;
119)
  # cuEquivariance's path tables as tuples (models/cueq_constants.py; on the CPU MP-0 medium's
  # first symmetric contraction traced in 0.7 s with 153 guards against 4.7 s with 22,450):
  # the GPU test, then stage 118's start-up (its warm runs take the planner's one compile
  # worker) with two more warm runs printing each frame Dynamo compiled, the second with the
  # tables left as lists, on the same machine and cache.
  gpu_tests 119 150 "$tests/test_cueq_constants_gpu.py"
  default_startup 330 120 startup-13824 --frames-warm --lists-warm
  grep -h "^frame:" "$OUT/startup-13824/warm-frames.log" "$OUT/startup-13824/warm-lists.log" \
    | cut -c1-260
  ;;
120)
  # The default path's rows of issue 30's table with today's planner (MH-1's pair tables inside
  # FastMACE's convolution from 1,728 atoms; cuEquivariance's path tables as tuples), the
  # defaults first: the budget stops new cases.
  timeout 400 python3 benchmarks/md_speed.py --out "$OUT/defaults" --budget-s 380 \
    --case-timeout-s 150 --only "mh-1/1728/fastmace-default,mh-1/216/fastmace-default,\
mp0-medium/13824/fastmace-default,mp0-medium/216/fastmace-default,mp0-medium/1728/fastmace-default" \
    > "$OUT/defaults.log" 2>&1
  echo "defaults: exit $?"; grep -E "ms/step|Error|error" "$OUT/defaults.log" | tail -8
  ;;
121)
  # Stage 118 once more, now that the compile cost is recorded after the first block (stage
  # 119's warm runs found no record: with FastMACE's own kernels the first forces run eagerly,
  # and the record was only written after them). Each run also steps 2,000 times (about 30 s):
  # 150 s a run. The warm runs' plans should show "workers 1"; the second prints its frames.
  gpu_tests 121 150 "$tests/test_cueq_constants_gpu.py"
  default_startup 420 150 startup-13824 --frames-warm
  grep -h "^frame:" "$OUT/startup-13824/warm-frames.log" | cut -c1-220
  ;;
122)
  # Stage 108's million atoms alone, for a session with few device minutes left (H200 only).
  timeout -k 20 290 python3 benchmarks/large_cells.py --atoms 1000000 \
    --out "$OUT/million" 2>&1 | grep -E "^\{|Error" | cut -c1-1500
  ;;
123)
  # The planner's one compile worker (set around the set-up and the run) against
  # TORCHINDUCTOR_COMPILE_THREADS=1 for the whole process (stage 117: 23.1-23.4 s against 28.8
  # s with the pool, on another machine; stage 121 with the planner's worker: 33.9-36.2 s):
  # a cold run and a warm one with the planner's worker, then two warm runs with the variable
  # (each startup_time.py call makes two runs of about 65 s; stage 124 follows on the same
  # machine with two more of the planner's).
  default_startup 260 150 startup-13824
  TORCHINDUCTOR_COMPILE_THREADS=1 default_startup 300 140 env-worker
  ;;
124)
  # Stage 123's second half, on its machine and cache: two more warm runs with the planner's
  # one worker.
  default_startup 300 140 plan-worker
  ;;
125)
  # Dynamo's own cache (benchmarks/precompile_probe.py: torch's caching_precompile, with what
  # stops it on the CPU worked around; there the compiled first call of a warm process took
  # 1.1 s with it and 7.1 s without): stage 121's cold and warm runs (today's path), then
  # three warm runs on the probe's path, the first saving what Dynamo makes (Inductor compiles
  # its graphs then: 170 s allowed), the second loading it, the third without the cache, each
  # printing its frames. Whether the GPU's load holds, or what stops it, is in their logs.
  default_startup 590 170 startup-13824 --precompile-warm
  grep -h "^frame:\|^precompile:\|cannot be saved\|could not compile\|Error" \
    "$OUT"/startup-13824/warm-precompile*.log | cut -c1-260 | head -40
  ;;
127)
  # Stage 125 for a session with few device seconds: only the probe's three runs (the first
  # fills an empty cache root, then saves Dynamo's entry; then loaded, then without it).
  default_startup 420 190 startup-13824 --precompile-only
  grep -h "^frame:\|^precompile:\|cannot be saved\|could not compile\|Error" \
    "$OUT"/startup-13824/warm-precompile*.log | cut -c1-260 | head -40
  ;;
126)
  # Two short measurements of a warm start's pieces: e3nn's spherical harmonics at their first
  # eager calls, TorchScript against the Python function (stage 116's profile: 1.65 s inside
  # them), and each import a warm start pays (tools/validation/import_floor.py).
  timeout 100 python3 tools/validation/harmonics_first_calls.py > "$OUT/harmonics.txt" 2>&1
  cat "$OUT/harmonics.txt"
  timeout 200 python3 tools/validation/import_floor.py --once > "$OUT/import_floor.txt" 2>&1
  cat "$OUT/import_floor.txt"
  ;;
esac
# Keep what is worth committing: the structures and run directories' other files stay behind.
find "$OUT" \( -name "*.extxyz" -o -name "*.prof" -o -name "restart.npz" -o -name "*.png" \
  -o -name "run.json" -o -name "thermo.csv" \) -delete
# The device returns at most 8 files: everything travels in one archive.
tar czf "/tmp/results-${1:-1}.tgz" -C "$OUT" . && find "$OUT" -mindepth 1 -delete \
  && mv "/tmp/results-${1:-1}.tgz" "$OUT/"
