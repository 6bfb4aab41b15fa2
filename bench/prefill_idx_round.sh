#!/usr/bin/env bash
# The prefill indexer's round on a machine with an NVIDIA GPU (an H200
# here), from the repository root: the tensor-core index scores and
# selection of prefill rows (src/cuda/kernels/indexer/).
#
#   build     configure (sm_90a) and build the CLI and the CUDA tests;
#   ptxas     ptxas' report, sm_90a and sm_80: no spills;
#   sweep     the prefill selection cases of the GPU sweep (names "pfsel"),
#             Hopper products (the default on the H200):
#             every selected id of every prefill row against the CPU oracle,
#             and every output; PFI_SWEEP=quick (default) or full (adds the
#             8K and 32K prompts, 1K new tokens after 127K, 2K after 30K),
#             then the quick ones on grids for 8 SMs (--sms 8: tiles
#             without key-range splits, several tiles per CTA) and with
#             the mma.sync products (--no-prefill-wgmma);
#   graph     the graph test (steps of any mix replayed after updates);
#   memcheck  compute-sanitizer memcheck on two small prefill cases, then
#             racecheck on one;
#   bench     the whole sparse layer with the prefill indexer's wgmma and
#             mma.sync products (the msa program's MSA_CUDA_PFI_WGMMA=0),
#             against the same with the scalar role (MSA_CUDA_PFI=0): single
#             prompts of 4K new tokens after 4K and 28K; the attention is
#             the same in all three, so the differences are the indexer's
#             and the selection's; then the 66 weighted cases of the prefill
#             workload with the new path alone (time-limited; the scalar
#             role would not finish them in time).
# Logs in $OUT (at most 8 files): summary.txt, build.log, sweep.log,
# graph.log, sanitize.log, bench.log, bench_pfi.json.
#
# Steps: PFI_STEPS (comma list, default build,ptxas,sweep,graph,memcheck,bench).
# Usage (repository root):  OUT=/some/dir bench/prefill_idx_round.sh
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/prefill-idx-round-out}
BUILD=${BUILD:-$ROOT/build-pfi-gpu} # inside the tree (git-ignored): kept between calls
STEPS=${PFI_STEPS:-build,ptxas,sweep,graph,memcheck,bench}
SWEEP=${PFI_SWEEP:-quick}
JOBS=$(nproc 2>/dev/null || echo 8)
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export PATH=/usr/local/cuda/bin:$PATH

has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
note() { printf '%-44s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }

# run NAME LOG LIMIT CMD...: output appended to $OUT/LOG, ok/FAIL noted.
run() {
    local name=$1 log=$2 limit=$3
    shift 3
    local t0 rc dt
    t0=$(date +%s)
    echo "==== $name: $*" >>"$OUT/$log"
    timeout -k 5 "$limit" "$@" >>"$OUT/$log" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
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
        -DCMAKE_CUDA_ARCHITECTURES=90a-real "${CMAKE_EXTRA[@]}" &&
        run build build.log 500 cmake --build "$BUILD" -j "$JOBS" --target msa_cli test_cuda_sweep test_cuda_graph
fi
MSA="$BUILD/msa"
SW="$BUILD/tests/cuda/test_cuda_sweep"
[ -x "$SW" ] || SW=$(find "$BUILD" -name test_cuda_sweep -type f -perm -u+x | head -1)
GR=$(find "$BUILD" -name test_cuda_graph -type f -perm -u+x | head -1)

if has_step ptxas; then
    # The library's own check (tests/cuda/check_ptxas.sh) on the kernel files.
    for arch in sm_90a sm_80; do
        run "ptxas $arch" build.log 300 sh "$ROOT/tests/cuda/check_ptxas.sh" nvcc "$ROOT" "$arch" \
            "-O3 -lineinfo -DMSA_BUILDING_LIBRARY -DMSA_HAVE_CUDA" \
            src/cuda/kernels/indexer/indexer_prefill_mma_sm80.cu \
            src/cuda/kernels/indexer/indexer_prefill_wgmma_sm90.cu
    done
fi

if has_step sweep; then
    # Shards side by side: the single-threaded oracle is most of the time.
    args=(--filter pfsel)
    [ "$SWEEP" = quick ] && args+=(--quick)
    n=$((JOBS > 8 ? 8 : JOBS))
    for ((sh = 0; sh < n; sh++)); do
        run "sweep pfsel $SWEEP shard $sh/$n" sweep.log 540 "$SW" "${args[@]}" --shard "$sh/$n" &
    done
    # Grids for 8 SMs (16 CTAs): few key-range splits, many tiles per CTA;
    # and the mma.sync products on the H200 (the sm_80 path's code).
    for ((sh = 0; sh < 4; sh++)); do
        run "sweep pfsel quick 8 SMs shard $sh/4" sweep.log 540 "$SW" --sms 8 --quick --filter pfsel \
            --shard "$sh/4" &
        run "sweep pfsel quick mma.sync shard $sh/4" sweep.log 540 "$SW" --no-prefill-wgmma --quick \
            --filter pfsel --shard "$sh/4" &
    done
    wait
fi

if has_step graph; then
    run "graph test" graph.log 300 "$GR"
fi

if has_step memcheck; then
    CS=compute-sanitizer
    run "memcheck pfsel union2" sanitize.log 400 $CS --tool memcheck --error-exitcode 9 "$SW" --filter "pfsel union2" &
    run "memcheck pfsel hi3 (mma.sync)" sanitize.log 400 $CS --tool memcheck \
        --error-exitcode 9 "$SW" --no-prefill-wgmma --filter "pfsel hi3" &
    run "racecheck pfsel union4" sanitize.log 500 $CS --tool racecheck --error-exitcode 9 "$SW" --filter "pfsel union4" &
    wait
fi

if has_step bench; then
    # The whole layer; the msa program maps its MSA_CUDA_PFI* variables to
    # the debugging options cuda_no_prefill_wgmma and cuda_no_prefill_indexer.
    for ctx in 8192 32768; do
        run "bench 4K new after $((ctx - 4096)) (pfi wgmma)" bench.log 120 \
            "$MSA" bench --backend cuda --decode-context "$ctx" --batch 1 --q-len 4096
        run "bench 4K new after $((ctx - 4096)) (pfi mma.sync)" bench.log 120 env MSA_CUDA_PFI_WGMMA=0 \
            "$MSA" bench --backend cuda --decode-context "$ctx" --batch 1 --q-len 4096
        run "bench 4K new after $((ctx - 4096)) (scalar)" bench.log 120 env MSA_CUDA_PFI=0 \
            "$MSA" bench --backend cuda --decode-context "$ctx" --batch 1 --q-len 4096 --reps 3 --warmup 1
    done
    run "bench prefill workload (pfi)" bench.log 300 \
        "$MSA" bench --backend cuda --workload prefill --suite representative --json "$OUT/bench_pfi.json"
fi
echo "---- summary"
cat "$SUMMARY"
