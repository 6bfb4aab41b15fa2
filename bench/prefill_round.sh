#!/usr/bin/env bash
# The prefill round on a machine with an NVIDIA GPU (an H200 here), from the
# repository root: configure and build with the CUDA backend (sm_90a and
# sm_80), then
#   checks    ptxas (no spills, both architectures), the CUDA schedule test
#             and the graph test;
#   sweep     the prefill cases of the GPU sweep (shapes pf*: head dim 128,
#             8- and 32-token tiles, head chunks, page sizes 1..256,
#             contexts to 32K, several requests beside decode rows) against
#             the CPU oracle, full set, in shards; then the whole quick
#             sweep (every step kind: nothing else regressed);
#   sanitize  compute-sanitizer memcheck and racecheck on small prefill
#             cases;
#   bench     `msa bench --backend cuda --workload prefill` (the 66 weighted
#             cases), and single prompts of 8K and 32K new tokens, sparse
#             and dense layer side by side, each under a time limit; the
#             single prompts again with MSA_CUDA_PF_TMA=0 (the msa
#             program's variable for the debugging option
#             cuda_no_prefill_tma: the mma.sync prefill kernel instead of
#             the Hopper one).
# Logs go to $OUT (at most 8 files): summary.txt, build.log, checks.log,
# sweep.log, sanitize.log, bench.log, bench.json, single.log.
#
# Steps can be chosen with PF_STEPS (comma list of
# build,checks,sweep,sanitize,bench; default all); the bench's time limit
# with BENCH_TIMEOUT (seconds, default 330, each of its two runs), its repetitions with
# BENCH_REPS (default 3).
#
# ---- prefill-idx section --------------------------------------------------
# The index-score / selection work adds its own steps below the marked line
# near the end of this file (or in bench/prefill_idx_round.sh).
# ---------------------------------------------------------------------------
#
# Usage (repository root):  OUT=/some/dir bench/prefill_round.sh
# Under a 10-minute limit per command, run it in four calls that share the
# build folder (in the repository, git-ignored, so it stays between calls):
#   PF_STEPS=build,checks  PF_STEPS=sweep  PF_STEPS=sanitize  PF_STEPS=bench
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/prefill-round-out}
BUILD=${BUILD:-$ROOT/build-prefill-round}
STEPS=${PF_STEPS:-build,checks,sweep,sanitize,bench}
JOBS=$(nproc 2>/dev/null || echo 8)
BENCH_TIMEOUT=${BENCH_TIMEOUT:-330}
BENCH_REPS=${BENCH_REPS:-3}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export PATH=/usr/local/cuda/bin:$PATH

has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
note() { printf '%-40s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }

# Runs NAME LOG TIMEOUT CMD...: output appended to $OUT/LOG, ok/FAIL noted.
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
    # No cJSON on the machine: use the packages carried in build-deps/.
    mkdir -p /tmp/msa-deps
    for f in "$ROOT"/build-deps/*.deb; do dpkg -x "$f" /tmp/msa-deps; done
    CJ=/tmp/msa-deps/usr
    CMAKE_EXTRA+=("-DCJSON_INCLUDE_DIR=$CJ/include" "-DCJSON_LIBRARY=$CJ/lib/x86_64-linux-gnu/libcjson.so")
    export LD_LIBRARY_PATH="$CJ/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
    export LIBRARY_PATH="$CJ/lib/x86_64-linux-gnu:${LIBRARY_PATH:-}"
    export C_INCLUDE_PATH="$CJ/include:${C_INCLUDE_PATH:-}"
fi

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >>"$SUMMARY" 2>&1

if has_step build; then
    run configure build.log 300 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON \
        "-DCMAKE_CUDA_ARCHITECTURES=80-real;90a-real" "${CMAKE_EXTRA[@]}" || exit 1
    run build build.log 540 cmake --build "$BUILD" -j "$JOBS" || { tail -40 "$OUT/build.log"; exit 1; }
fi
SWEEP="$BUILD/tests/cuda/test_cuda_sweep"
MSA="$BUILD/msa"

if has_step checks; then
    (cd "$BUILD" && run ptxas checks.log 600 ctest --output-on-failure -R 'test_cuda_ptxas')
    (cd "$BUILD" && run schedule+graph checks.log 300 ctest --output-on-failure \
        -R 'test_cuda_schedule|test_cuda_graph')
fi

if has_step sweep; then
    # Prefill cases (every shape named pf*), full set, 8 shards side by side:
    # the single-threaded oracle takes most of the time.
    for i in 0 1 2 3 4 5 6 7; do
        run "sweep pf shard $i/8" "sweep_pf_$i.tmp" 330 "$SWEEP" --prefill --filter pf --shard "$i/8" &
    done
    wait
    for i in 0 1 2 3 4 5 6 7; do cat "$OUT/sweep_pf_$i.tmp" >>"$OUT/sweep.log"; rm -f "$OUT/sweep_pf_$i.tmp"; done
    # The whole quick set with its prefill steps (decode, verify, extend,
    # mixed, sequences, random; prefill rows of other head dims take the
    # scalar rows), 4 shards.
    for i in 0 1 2 3; do
        run "sweep quick shard $i/4" "sweep_q_$i.tmp" 240 "$SWEEP" --quick --prefill --shard "$i/4" &
    done
    wait
    for i in 0 1 2 3; do cat "$OUT/sweep_q_$i.tmp" >>"$OUT/sweep.log"; rm -f "$OUT/sweep_q_$i.tmp"; done
    grep -E "^(FAIL|fail)|failed|mismatch" "$OUT/sweep.log" | head -40 >>"$SUMMARY"
fi

if has_step sanitize; then
    run "memcheck pf quick" sanitize.log 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$SWEEP" --quick --prefill --filter pf128
    run "racecheck pf quick" sanitize.log 200 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$SWEEP" --quick --prefill --filter pfm3/prefill-mix
    run "memcheck m3 prefill-small" sanitize.log 120 compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$SWEEP" --prefill --filter m3/prefill-small
    # The Hopper prefill kernel's dense stream (pfm3 dense, several requests
    # with ragged last pages) under both tools.
    run "memcheck pfm3 several" sanitize.log 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$SWEEP" --quick --prefill --filter pfm3/prefill-several
    run "racecheck pfm3 several" sanitize.log 200 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$SWEEP" --quick --prefill --filter pfm3/prefill-several
fi

if has_step bench; then
    run "bench prefill representative" bench.log "$BENCH_TIMEOUT" "$MSA" bench --backend cuda \
        --workload prefill --suite representative --reps "$BENCH_REPS" --warmup 1 --json "$OUT/bench.json"
    # Single prompts without a prefix, sparse and dense layer side by side.
    WL="$OUT/single.json.tmp"
    cat >"$WL" <<'EOF'
{"description": "single prompts without a prefix", "cases": [
 {"id": "single_8k", "tags": ["single"], "weight": 1, "requests": [{"prefix": 0, "new": 8192}]},
 {"id": "single_32k", "tags": ["single"], "weight": 1, "requests": [{"prefix": 0, "new": 32768}]},
 {"id": "ext_4k_after_64k", "tags": ["single"], "weight": 1, "requests": [{"prefix": 65536, "new": 4096}]}
]}
EOF
    run "bench single prompts (+dense)" single.log 200 "$MSA" bench --backend cuda \
        --workload prefill --workload-file "$WL" --suite single --dense --reps "$BENCH_REPS" --warmup 1
    # The same with the mma.sync prefill kernel instead of the Hopper one.
    run "bench single prompts, mma.sync prefill" single.log 200 env MSA_CUDA_PF_TMA=0 "$MSA" bench \
        --backend cuda --workload prefill --workload-file "$WL" --suite single --dense \
        --reps "$BENCH_REPS" --warmup 1
    rm -f "$WL"
fi

# ---- prefill-idx section: steps of the index-score / selection work --------
# ---- end of prefill-idx section ---------------------------------------------

echo
cat "$SUMMARY"
