#!/usr/bin/env bash
# One whole GPU round on a machine with an NVIDIA GPU (an H200 here): configure
# and build with the CUDA backend for sm_90a, run the CTest
# suite (CPU and GPU tests), `msa check --backend cuda`, `msa bench --backend
# cuda --workload decode` with 8 and with 1 query token per request, and
# compute-sanitizer memcheck and racecheck on the GPU tests (last: slowest).
#
# Every step's log is appended to $OUT/all.log as the step ends (few files
# in $OUT: it is meant to be copied back whole), JSON results and the
# summary stay beside it; a short table is printed last.  Steps can be chosen
# with ROUND_STEPS (comma list of build,ctest,gputest,sanitize,check,bench,
# profile,source,ab,timeline; default all but source, ab and timeline; they
# run in this script's order, build, ctest, gputest, check, bench, profile,
# source, ab, timeline, sanitize, whatever the order given: a change that may
# hang the GPU tests is better timed first in a round without them, or with a
# low STEP_TIMEOUT), the decode suite with BENCH_SUITE (default full), extra
# bench arguments with BENCH_ARGS, extra CMake arguments with
# ROUND_CMAKE_ARGS, test_cuda_sweep arguments with SWEEP_ARGS (e.g. --quick),
# its processes with SWEEP_SHARDS (the gputest step's sweep, default 4) and
# QUICK_SHARDS (each of its quick modes, default 3).
#
# The CUDA backend's debugging aids are msa_debug_options fields: the tests
# take them as flags (--sms N, --sel-warp-rows, --sel-unions,
# --no-prefill-tma, --no-prefill-indexer, --no-prefill-wgmma), the `msa`
# program from its environment (MSA_CUDA_SMS, MSA_CUDA_TMA=0, MSA_CUDA_PDL=0,
# MSA_CUDA_SEL_WARP_ROWS=1, MSA_CUDA_SEL_UNIONS=1, MSA_CUDA_PF_TMA=0,
# MSA_CUDA_PFI=0, MSA_CUDA_PFI_WGMMA=0, MSA_CUDA_TIMELINE=path).
#
# Usage (repository root):  bench/gpu_round.sh
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-round-out}
BUILD=${BUILD:-/tmp/msa-gpu-build}
STEPS=${ROUND_STEPS:-build,ctest,gputest,check,bench,profile,sanitize}
SUITE=${BENCH_SUITE:-full}
JOBS=$(nproc 2>/dev/null || echo 8)
LOGS=${LOGS:-/tmp/msa-round-logs}
mkdir -p "$OUT" "$LOGS"
: >"$OUT/all.log"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
note() { printf '%-34s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }
stamp() { date +%s; }

# Runs a command with its output in $LOGS/<name>.log; notes ok/FAIL (rc) and seconds.
run_logged() {
    local name=$1
    shift
    local t0 rc
    t0=$(stamp)
    # A hung step must not eat the whole run: STEP_TIMEOUT seconds each.
    timeout -k 5 "${STEP_TIMEOUT:-300}" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    local dt=$(($(stamp) - t0))
    { echo "==== $name (rc $rc, ${dt}s): $*"; cat "$LOGS/$name.log"; } >>"$OUT/all.log"
    if [ $rc -eq 0 ]; then
        note "$name" "ok (${dt}s)"
    elif [ $rc -eq 77 ]; then
        note "$name" "skipped (${dt}s)"
    else
        note "$name" "FAIL rc=$rc (${dt}s)"
    fi
    return $rc
}

# Runs a sweep command (the arguments after NAME and N, an `env` prefix
# allowed) in N shards side by side, in the background (the caller
# waits): most of a sweep's time is the single-threaded CPU oracle's, and
# the shards' longest case then bounds it.  Logs NAME_s0 .. NAME_s<N-1>.
sweep_shards() {
    local name=$1 n=$2
    shift 2
    for ((sh = 0; sh < n; sh++)); do
        run_logged "${name}_s$sh" "$@" --shard "$sh/$n" &
    done
}

# After the caller's wait: the shards' logs joined into $LOGS/NAME.log,
# their failures and their summed counts into the summary.
sweep_sum() {
    local name=$1 n=$2
    for ((sh = 0; sh < n; sh++)); do cat "$LOGS/${name}_s$sh.log"; done >"$LOGS/$name.log"
    grep -E "FAIL" "$LOGS/$name.log" | head -12 >>"$SUMMARY"
    grep -E "^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped" "$LOGS/$name.log" |
        awk -v n="$n" -v name="$name" '{p += $1; f += $3; s += $5; k++}
            END {printf "%s, %d of %d shards reported: %d passed, %d failed, %d skipped\n", name, k, n, p, f, s}' \
        >>"$SUMMARY"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem \
    --format=csv >"$OUT/gpu.txt" 2>&1 || true
note "gpu" "$(tail -n +2 "$OUT/gpu.txt" | head -1)"

# ---- build -------------------------------------------------------------------
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

# Configures a Release build with the CUDA backend for the H200 in directory
# $2, as step $1; further CMake arguments follow.
configure_cuda() {
    local name=$1 dir=$2
    shift 2
    run_logged "$name" cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a-real "${CMAKE_EXTRA[@]}" "$@"
}

# Median µs of the one shape a bench JSON file holds ("?" if none).
json_median() {
    python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["results"][0]["time_us"]["median"])' "$1" 2>/dev/null || echo "?"
}

# The bench arguments of a step shape: batch $1 and context $2, or a case of
# the decode workload when $1 is its id (decode_..., context ignored).
shape_args() {
    if [[ "$1" == decode_* ]]; then echo "--workload decode --cases $1"
    else echo "--decode-context $2 --batch $1"; fi
}

# Median µs of 40 graph replays of shape batch $3, context $4, q_len $5 with
# binary $1 (its output appended to $LOGS/$2.log); further arguments are
# environment assignments for that run.  A batch given as a case id of the
# decode workload (e.g. decode_b128_kv4000, context ignored) times that case
# with its own request lengths.  "?" when the run failed or outlasted
# SHAPE_TIMEOUT seconds (default 120).
shape_median() {
    local bin=$1 log=$2 b=$3 l=$4 q=$5
    shift 5
    rm -f /tmp/msa-shape.json
    # shellcheck disable=SC2046  # shape_args prints separate words
    timeout -k 5 "${SHAPE_TIMEOUT:-120}" env "$@" "$bin" bench --backend cuda $(shape_args "$b" "$l") \
        --q-len "$q" --reps 40 --json /tmp/msa-shape.json >/tmp/msa-shape.log 2>&1
    local rc=$?
    cat /tmp/msa-shape.log >>"$LOGS/$log.log"
    # A failed run's output goes to all.log (the step's log is not copied back).
    [ $rc -ne 0 ] && { echo "==== $log: $bin b$b ctx $l q$q (rc $rc)"; tail -20 /tmp/msa-shape.log; } >>"$OUT/all.log"
    json_median /tmp/msa-shape.json
}

if has_step build; then
    configure_cuda configure "$BUILD" ${ROUND_CMAKE_ARGS:-} || { cat "$LOGS/configure.log"; exit 1; }
    run_logged build cmake --build "$BUILD" -j "$JOBS" || { tail -50 "$LOGS/build.log"; exit 1; }
    # The CUDA tests, built by hand when the test tree does not list them yet.
    for t in test_cuda_graph test_cuda_sweep; do
        if [ ! -x "$BUILD/tests/cuda/$t" ]; then
            mkdir -p "$BUILD/tests/cuda"
            gcc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -DMSA_TEST_HAVE_CUDART \
                -I"$ROOT/include" -I"$ROOT/tests" -I"$ROOT/src" -I/usr/local/cuda/include \
                ${C_INCLUDE_PATH:+-I${C_INCLUDE_PATH%%:*}} \
                "$ROOT/tests/cuda/$t.c" -o "$BUILD/tests/cuda/$t" \
                "$BUILD/libmsa_oracle.a" "$BUILD/libmsa.a" -L/usr/local/cuda/lib64 -lcudart_static \
                ${LIBRARY_PATH:+-L${LIBRARY_PATH%%:*}} -lcjson -lstdc++ -lpthread -ldl -lrt -lm \
                >>"$LOGS/build.log" 2>&1 || note "build $t" "FAIL"
        fi
    done
fi
MSA="$BUILD/msa"
T="$BUILD/tests"

# ---- tests -------------------------------------------------------------------
if has_step ctest; then
    # CTEST_JOBS tests side by side (the GPU sweeps spend most of their time
    # in the CPU oracle, one core each).
    (cd "$BUILD" && run_logged ctest_quick ctest -L quick -j "${CTEST_JOBS:-4}" --output-on-failure --timeout 600)
    grep -E "tests passed|Skipped|Failed|\*\*\*" "$LOGS/ctest_quick.log" | head -20 >>"$SUMMARY"
fi
if has_step gputest; then
    # The quick GPU tests are CTest's quick set: here only when the ctest
    # step did not just run them.  The full sweep always.
    quick=1
    has_step ctest && quick=0
    if [ $quick = 1 ]; then
        run_logged test_cuda_graph "$T/cuda/test_cuda_graph"
        # Grids for 8 SMs: CTAs of the one-CTA-per-SM kernels take several units.
        run_logged test_cuda_graph_few_sms "$T/cuda/test_cuda_graph" --sms 8
    fi
    # The sweeps side by side, each in shards: the full sweep in
    # SWEEP_SHARDS processes (default 4), each quick mode in QUICK_SHARDS
    # (default 3): 14 processes with the replay test, within the GPU
    # machine's 16 cores.
    NSH=${SWEEP_SHARDS:-4}
    QSH=${QUICK_SHARDS:-3}
    # shellcheck disable=SC2086  # SWEEP_ARGS: separate words
    sweep_shards test_cuda_sweep "$NSH" "$T/cuda/test_cuda_sweep" ${SWEEP_ARGS:-}
    if [ $quick = 1 ]; then
        # The selection's warp-per-row mode on the sweep's small steps too.
        sweep_shards test_cuda_sweep_warp_rows "$QSH" "$T/cuda/test_cuda_sweep" --quick --sel-warp-rows
        # The unions built by the selection, as for contexts beyond the
        # Hopper attention's own unions.
        sweep_shards test_cuda_sweep_sel_unions "$QSH" "$T/cuda/test_cuda_sweep" --quick --sel-unions
        sweep_shards test_cuda_sweep_few_sms "$QSH" "$T/cuda/test_cuda_sweep" --quick --sms 8
        # `msa replay DIR --backend cuda` on the replay test's cases.
        run_logged replay_cuda sh "$ROOT/tests/replay/run_replay_test.sh" "$MSA" /tmp/msa-replay-cuda cuda &
    fi
    wait
    sweep_sum test_cuda_sweep "$NSH"
    if [ $quick = 1 ]; then
        grep -E "FAIL|passed" "$LOGS/test_cuda_graph.log" | tail -8 >>"$SUMMARY"
        sweep_sum test_cuda_sweep_warp_rows "$QSH"
        sweep_sum test_cuda_sweep_sel_unions "$QSH"
        grep -E "FAIL|passed" "$LOGS/test_cuda_graph_few_sms.log" | tail -8 >>"$SUMMARY"
        sweep_sum test_cuda_sweep_few_sms "$QSH"
        grep -E "FAIL|passed|skipped" "$LOGS/replay_cuda.log" | tail -6 >>"$SUMMARY"
    fi
fi

# ---- msa check -----------------------------------------------------------------
if has_step check; then
    run_logged msa_check_decode "$MSA" check --backend cuda --decode-only
    run_logged msa_check_quick "$MSA" check --backend cuda --quick
    tail -2 "$LOGS/msa_check_decode.log" >>"$SUMMARY"
    tail -2 "$LOGS/msa_check_quick.log" >>"$SUMMARY"
fi

# ---- msa bench -----------------------------------------------------------------
if has_step bench; then
    for q in 8 1; do
        run_logged "bench_decode_q$q" "$MSA" bench --backend cuda --workload decode --suite "$SUITE" \
            --q-len "$q" --json "$OUT/bench_decode_q$q.json" ${BENCH_ARGS:-}
    done
fi

# ---- per-kernel profile (ncu) -------------------------------------------------
# PROFILE_CASES: space-separated batch:context:q_len shapes; one graph replay
# each, every kernel of the layer with its time and DRAM throughput
# (PROFILE_METRICS, PROFILE_SHOW: other metrics; PROFILE_EXTRA: more ncu
# options, e.g. --cache-control none to keep the L2 warm as in graph replay).
if has_step profile; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for pc in ${PROFILE_CASES:-8:100000:1 128:10000:8 1:128000:1}; do
        IFS=: read -r pb pl pq <<<"$pc"
        run_logged "profile_b${pb}_l${pl}_q${pq}" "$NCU" --clock-control none ${PROFILE_EXTRA:-} \
            --kernel-name regex:'cu_(prologue|indexer|select|attn|merge)' \
            --metrics "${PROFILE_METRICS:-gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size}" \
            --csv "$MSA" bench --backend cuda --decode-context "$pl" --batch "$pb" --q-len "$pq" \
            --reps 1 --warmup 0 --copies 1 --sets 2
    done
fi

# ---- per-instruction stall samples (ncu source page) ------------------------
# SOURCE_CASES: space-separated kernel@batch:context:q_len entries (kernel: a
# name regex, e.g. cu_select@1:128000:1); one launch each, warp-state samples
# per SASS instruction, as CSV in $OUT/source_<n>.csv (step "source", not in
# the default list).
if has_step source; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    n=0
    for sc in ${SOURCE_CASES:-cu_select@1:128000:1}; do
        n=$((n + 1))
        sk=${sc%@*}
        IFS=: read -r sb sl sq <<<"${sc#*@}"
        run_logged "source_profile_$n" "$NCU" --clock-control none --cache-control none \
            --kernel-name regex:"$sk" --launch-count 1 \
            --section SourceCounters --section WarpStateStats -f -o "/tmp/msa-source-$n" \
            "$MSA" bench --backend cuda --decode-context "$sl" --batch "$sb" --q-len "$sq" \
            --reps 1 --warmup 0 --copies 1 --sets 2
        run_logged "source_print_$n" bash -c "'$NCU' -i /tmp/msa-source-$n.ncu-rep --page source --csv \
            --print-source sass > '$OUT/source_$n.csv'"
    done
fi

# ---- A/B of a runtime switch or a patch (graph replay) ------------------------
# AB_ENV: an environment assignment (e.g. MSA_CUDA_PDL=0); AB_CASES:
# batch:context:q_len shapes, each timed without and with it, in turns
# (AB_ROUNDS times, default 3), so drift of the machine hits both alike
# (step "ab", not in the default list).  AB_PATCH: a patch (patch -p1, path
# from the repository root) in place of AB_ENV, for a change that has no
# switch: "with" is then a build of a copy of the tree with it applied, in
# $BUILD-patch.
if has_step ab; then
    AB_BIN="$MSA"
    AB_WITH=("${AB_ENV:-MSA_AB=1}")
    AB_LABEL=${AB_ENV:-?}
    if [ -n "${AB_PATCH:-}" ]; then
        AB_SRC=/tmp/msa-ab-patch-src
        AB_BIN="$BUILD-patch/msa"
        AB_WITH=()
        AB_LABEL=$(basename "$AB_PATCH")
        rm -rf "$AB_SRC" && mkdir -p "$AB_SRC"
        (cd "$ROOT" && tar --exclude=./.git -cf - .) | (cd "$AB_SRC" && tar -xf -)
        run_logged ab_patch_apply patch -s -p1 -d "$AB_SRC" -i "$(realpath "$AB_PATCH")" &&
            (ROOT=$AB_SRC && configure_cuda configure_patch "$BUILD-patch" &&
                run_logged build_patch cmake --build "$BUILD-patch" -j "$JOBS" --target msa_cli)
    fi
    echo "---- A/B: median µs per round, without | with $AB_LABEL" >>"$SUMMARY"
    for ac in ${AB_CASES:-8:100000:8}; do
        IFS=: read -r ab al aq <<<"$ac"
        line_a="b${ab} ctx ${al} q${aq}:"
        line_b=""
        for _round in $(seq "${AB_ROUNDS:-3}"); do
            line_a="$line_a $(shape_median "$MSA" ab "$ab" "$al" "$aq")"
            line_b="$line_b $(shape_median "$AB_BIN" ab "$ab" "$al" "$aq" "${AB_WITH[@]}")"
        done
        echo "$line_a |$line_b" >>"$SUMMARY"
    done
fi

# ---- kernel timeline (graph replay) -------------------------------------------
# TIMELINE_CASES: space-separated batch:context:q_len shapes; a second build
# with the stamps compiled in (-DMSA_TIMELINE, in $BUILD-timeline) runs each
# with MSA_CUDA_TIMELINE set, and the last replay's per-CTA stamps (entry,
# back from the launch wait, first copy issued, first and last work in hand,
# exit) are summarized per kernel into the summary (bench/timeline.py) and
# copied to $OUT as msa-timeline-b<batch>-l<context>-q<q_len>.csv (step
# "timeline", not in the default list).  TIMELINE_FLAGS: more CUDA flags of
# that build.
if has_step timeline; then
    TLB="$BUILD-timeline"
    configure_cuda configure_timeline "$TLB" "-DCMAKE_CUDA_FLAGS=-DMSA_TIMELINE ${TIMELINE_FLAGS:-}"
    run_logged build_timeline cmake --build "$TLB" -j "$JOBS" --target msa_cli
    for tc in ${TIMELINE_CASES:-1:131072:1 8:10000:1}; do
        IFS=: read -r tb tlen tq <<<"$tc"
        csv="/tmp/msa-timeline-b${tb}-l${tlen}-q${tq}.csv"
        MSA_CUDA_TIMELINE="$csv" run_logged "timeline_b${tb}_l${tlen}_q${tq}" "$TLB/msa" bench --backend cuda \
            --decode-context "$tlen" --batch "$tb" --q-len "$tq" --reps 20 >/dev/null
        { echo "---- timeline b${tb} ctx ${tlen} q${tq} (µs after the first stamp)"
          if [ -s "$csv" ]; then python3 "$ROOT/bench/timeline.py" "$csv" 2>&1; else echo "no timeline written"; fi
        } >>"$SUMMARY"
        # The per-CTA stamps too (small), for the spread between CTAs.
        [ -s "$csv" ] && cp "$csv" "$OUT/"
    done
fi

# ---- sanitizers ----------------------------------------------------------------
if has_step sanitize; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    # Every run below in its own process, all side by side (each is bound by
    # the sanitizer's instrumented kernels or the test's oracle, not by the
    # GPU's capacity): the step lasts as long as the longest run.
    # memcheck on both GPU tests (quick subset; the sweep in two shards),
    # racecheck on the graph test: it runs every kernel of both paths at
    # small sizes.
    run_logged sanitize_memcheck_graph "$CS" --tool memcheck --error-exitcode 3 "$T/cuda/test_cuda_graph" &
    for sh in 0 1; do
        run_logged "sanitize_memcheck_sweep_s$sh" "$CS" --tool memcheck --error-exitcode 3 \
            "$T/cuda/test_cuda_sweep" --quick --shard "$sh/2" &
    done
    run_logged sanitize_racecheck_graph "$CS" --tool racecheck --error-exitcode 3 "$T/cuda/test_cuda_graph" &
    # The graph test's model (8 query heads per KV head) never takes the
    # Hopper attention: sweep cases of M3's shape do, on grids for 8 SMs so
    # that their CTAs take several units (the producers in turns).
    # RACE_FEW_SMS: ';'-separated sweep filters run so (units of one item,
    # of pairs, of one token); RACE_FULL: filters run on full grids (a
    # context long enough to wrap the indexer's ring).
    run_logged sanitize_memcheck_sweep_few_sms "$CS" --tool memcheck --error-exitcode 3 \
        "$T/cuda/test_cuda_sweep" --sms 8 --filter "q8/1/3/16" &
    IFS=';' read -ra RFEW <<<"${RACE_FEW_SMS:-q8/1/3/16;q16/5;q1 30K}"
    for i in "${!RFEW[@]}"; do
        run_logged "sanitize_racecheck_sweep_few_sms_$((i + 1))" "$CS" --tool racecheck \
            --error-exitcode 3 "$T/cuda/test_cuda_sweep" --sms 8 --filter "${RFEW[$i]}" &
    done
    IFS=';' read -ra RFULL <<<"${RACE_FULL:-b1 q1 200K}"
    for i in "${!RFULL[@]}"; do
        run_logged "sanitize_racecheck_sweep_$((i + 1))" "$CS" --tool racecheck --error-exitcode 3 \
            "$T/cuda/test_cuda_sweep" --filter "${RFULL[$i]}" &
    done
    wait
    for f in "$LOGS"/sanitize_*.log; do
        echo "$(basename "$f" .log): $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$f" | tail -1)" >>"$SUMMARY"
        grep -hE "^m3 .*(ok|FAIL|SKIP)" "$f" | head -4 >>"$SUMMARY"
    done
fi

# Per-kernel times of the profiles, compact: kernel, metric, value.
if has_step profile; then
    for f in "$LOGS"/profile_*.log; do
        [ -e "$f" ] || continue
        echo "---- $(basename "$f" .log)" >>"$SUMMARY"
        grep -E '^"[0-9]' "$f" | awk -F'","' '{gsub(/"/,"",$NF); k=$5; sub(/\(.*/,"",k); sub(/^void /,"",k); printf "%-28s %-58s %s\n", substr(k,1,28), $(NF-2), $NF}' \
            | grep -E "${PROFILE_SHOW:-gpu__time_duration|dram__throughput}" | sort -u >>"$SUMMARY" || true
    done
fi

echo
echo "==== gpu round summary ($(date -u +%Y-%m-%dT%H:%MZ)) ===="
cat "$SUMMARY"
if has_step bench; then
    for q in 8 1; do
        echo "---- decode, q_len $q ----"
        # The bench prints its own table; its last lines hold the aggregate.
        tail -40 "$LOGS/bench_decode_q$q.log"
    done
fi
