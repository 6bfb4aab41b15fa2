#!/usr/bin/env bash
# One device call that validates a change on an NVIDIA GPU (an H200 here)
# and times it against a base tree, within a 10-minute limit:
#   1. builds the tree (and, when BASE is given, the base tree beside it)
#      for sm_90a + sm_80;
#   2. correctness: the graph test (whole grid and 8 SMs), the quick sweep
#      with its prefill steps (6 shards), the prefill cases of the sweep's
#      quick set (again with the key-block-major attention in chunks of 40
#      tokens, and the graph test in chunks of 24), the key-block-major
#      cases off the M3 shape, `msa replay --backend
#      cuda`, compute-sanitizer memcheck and
#      racecheck on small prefill and decode steps, and test_plan_txn;
#   3. prefill: `msa bench --workload prefill` (66 weighted cases) and single
#      prompts of 8K and 32K (sparse and dense layers);
#   4. decode A/B against BASE (bench/ab_decode.sh), when BASE is given.
# Steps with FINAL_STEPS (comma list of build,tests,sweep-prefill,prefill,ab;
# default all but sweep-prefill).
# Logs in $OUT (at most 8 files): summary.txt, tests.log, prefill.log,
# prefill.json, ab.log, build.log.
#
# Usage (repository root): OUT=dir BASE=path/to/base/tree bench/final_round.sh
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/final-round-out}
BUILD=${BUILD:-/tmp/msa-final}
STEPS=${FINAL_STEPS:-build,tests,prefill,ab}
JOBS=$(nproc)
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export PATH=/usr/local/cuda/bin:$PATH
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
note() { printf '%-44s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }

# run NAME LOG LIMIT CMD...: output appended to $OUT/LOG; ok / FAIL noted.
run() {
    local name=$1 log=$2 limit=$3
    shift 3
    local t0=$(date +%s) rc
    echo "==== $name: $*" >>"$OUT/$log"
    timeout -k 5 "$limit" "$@" >>"$OUT/$log" 2>&1
    rc=$?
    local dt=$(($(date +%s) - t0))
    echo "==== $name: rc $rc, ${dt}s" >>"$OUT/$log"
    case $rc in
    0) note "$name" "ok (${dt}s)" ;;
    77) note "$name" "skipped (${dt}s)" ;;
    124 | 137) note "$name" "TIMEOUT (${dt}s)" ;;
    *) note "$name" "FAIL rc=$rc (${dt}s)" ;;
    esac
    return $rc
}

CMAKE_EXTRA=()
if [ ! -e /usr/include/cjson/cJSON.h ] && ls "$ROOT"/build-deps/*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/msa-deps
    for f in "$ROOT"/build-deps/*.deb; do dpkg -x "$f" /tmp/msa-deps; done
    CJ=/tmp/msa-deps/usr
    CMAKE_EXTRA+=("-DCJSON_INCLUDE_DIR=$CJ/include" "-DCJSON_LIBRARY=$CJ/lib/x86_64-linux-gnu/libcjson.so")
    export LD_LIBRARY_PATH="$CJ/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUMMARY" 2>&1

# The configure + build command of tree $1 in folder $2, as one sh -c
# command line (run's timeout runs commands, not shell functions).
BUILD_SH='cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=80-real;90a-real" $3 && cmake --build "$2" -j "$4"'
if has_step build; then
    if [ -n "${BASE:-}" ]; then
        run "build base" build.log 400 sh -c "$BUILD_SH" sh "$BASE" "$BUILD-base" "${CMAKE_EXTRA[*]}" "$JOBS" &
    fi
    run "build" build.log 400 sh -c "$BUILD_SH" sh "$ROOT" "$BUILD" "${CMAKE_EXTRA[*]}" "$JOBS" || { wait; tail -30 "$OUT/build.log"; exit 1; }
    wait
fi
MSA=$BUILD/msa
T=$BUILD/tests

if has_step tests; then
    run "graph test" tests.log 120 "$T/cuda/test_cuda_graph"
    # Grids for 8 SMs (the debugging option cuda_num_sms).
    run "graph test, 8 SMs" tests.log 120 "$T/cuda/test_cuda_graph" --sms 8
    run "plan transactions (CUDA part)" tests.log 120 "$T/test_plan_txn"
    run "bad input" tests.log 120 "$T/test_bad_input"
    for i in 0 1 2 3 4 5; do
        run "sweep quick+prefill $i/6" "tests_$i.tmp" 300 "$T/cuda/test_cuda_sweep" --quick --prefill --shard "$i/6" &
    done
    # The prefill selection cases with the other product kernel, when a
    # sweep flag for it is given (PFI_ALT, e.g. --no-prefill-wgmma).
    if [ -n "${PFI_ALT:-}" ]; then
        run "sweep pfsel, $PFI_ALT" "tests_p.tmp" 300 "$T/cuda/test_cuda_sweep" "$PFI_ALT" --quick \
            --filter pfsel &
    fi
    run "replay cuda" "tests_r.tmp" 300 sh "$ROOT/tests/replay/run_replay_test.sh" "$MSA" /tmp/msa-replay cuda &
    # The key-block-major prefill attention in several chunks of tokens.
    run "sweep pf, kbm chunks of 40" "tests_k.tmp" 300 "$T/cuda/test_cuda_sweep" --quick --prefill \
        --filter pf --kbm-chunk 40 &
    run "graph test, kbm chunks of 24" "tests_g.tmp" 120 "$T/cuda/test_cuda_graph" --kbm-chunk 24 &
    # Its shapes off M3's (the grid-stride merge and the bulk merge with
    # selection rows of 12 blocks).
    run "sweep pfsel kbm shapes" "tests_s.tmp" 200 "$T/cuda/test_cuda_sweep" --prefill \
        --filter "pfsel kbm" &
    wait
    for f in "$OUT"/tests_*.tmp; do cat "$f" >>"$OUT/tests.log"; rm -f "$f"; done
    grep -E "FAIL" "$OUT/tests.log" | head -20 >>"$SUMMARY"
    grep -E "^[0-9]+ passed, [0-9]+ failed" "$OUT/tests.log" |
        awk '{p += $1; f += $3; s += $5} END {printf "sweeps and tests: %d passed, %d failed, %d skipped\n", p, f, s}' >>"$SUMMARY"
    run "memcheck prefill (pfm3 quick)" tests.log 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$T/cuda/test_cuda_sweep" --quick --prefill --filter pfm3/prefill-mix/
    run "racecheck prefill (pfm3 quick)" tests.log 150 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$T/cuda/test_cuda_sweep" --quick --prefill --filter pfm3/prefill-mix/
    run "memcheck decode (m3 quick)" tests.log 100 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$T/cuda/test_cuda_sweep" --quick --filter m3/
fi

# The whole prefill set of the sweep (contexts to 32K, step "sweep-prefill",
# not in the default list: about 5 minutes of the oracle's time in 8 shards).
if has_step sweep-prefill; then
    for i in 0 1 2 3 4 5 6 7; do
        run "sweep prefill set $i/8" "tests_f$i.tmp" 330 "$T/cuda/test_cuda_sweep" --prefill --filter pf \
            --shard "$i/8" &
    done
    wait
    for f in "$OUT"/tests_f*.tmp; do cat "$f" >>"$OUT/tests.log"; rm -f "$f"; done
    grep -E "FAIL" "$OUT/tests.log" | head -20 >>"$SUMMARY"
fi

if has_step prefill; then
    run "bench prefill representative" prefill.log 200 "$MSA" bench --backend cuda --workload prefill \
        --workload-file "$ROOT/bench/workloads/prefill.json" --suite representative --reps 5 --warmup 1 \
        --json "$OUT/prefill.json"
    WL=/tmp/single.json
    cat >"$WL" <<'JSON'
{"description": "single prompts without a prefix, and one extend", "cases": [
 {"id": "single_8k", "tags": ["single"], "weight": 1, "requests": [{"prefix": 0, "new": 8192}]},
 {"id": "single_32k", "tags": ["single"], "weight": 1, "requests": [{"prefix": 0, "new": 32768}]},
 {"id": "ext_4k_after_64k", "tags": ["single"], "weight": 1, "requests": [{"prefix": 65536, "new": 4096}]}
]}
JSON
    run "bench single prompts (+dense)" prefill.log 120 "$MSA" bench --backend cuda --workload prefill \
        --workload-file "$WL" --suite single --dense --reps 3 --warmup 1
    # Again with a debugging option of the msa program, when one is given
    # (PF_OFF_ENV: an environment assignment, e.g. MSA_CUDA_PF_TMA=0).
    if [ -n "${PF_OFF_ENV:-}" ]; then
        run "bench single prompts, $PF_OFF_ENV" prefill.log 120 env "$PF_OFF_ENV" "$MSA" bench --backend cuda \
            --workload prefill --workload-file "$WL" --suite single --reps 3 --warmup 1
    fi
fi

if has_step ab && [ -n "${BASE:-}" ]; then
    run "decode A/B base vs new" ab.log "${AB_TIMEOUT:-300}" "$ROOT/bench/ab_decode.sh" "$BUILD-base/msa" "$MSA" /tmp/ab "${AB_ROUNDS:-2}"
    grep -E "worst|ab:" "$OUT/ab.log" >>"$SUMMARY"
fi
echo
cat "$SUMMARY"
