#!/usr/bin/env bash
# The Python package on an NVIDIA GPU, in one command of a few minutes:
#   1. builds libmsa.so with the CUDA backend (Release, sm_90a unless
#      CUDA_ARCHS says otherwise; no tests, no msa program);
#   2. runs python/tests/test_msa.py and python/tests/test_torch.py on it
#      (the CUDA tests of test_torch.py: torch CUDA tensors, CUDA graph
#      capture of torch.ops.msa.forward replayed over plan updates, the tiny
#      model with CUDA graph decode);
#   3. runs python/examples/tiny_m3.py --device cuda (fp32 and bf16, CUDA
#      graphs for decode), then once more without CUDA graphs;
#   4. runs python/tests/test_tp.py (two ranks over gloo on the CPU, and
#      over nccl where there are two GPUs) and, with two GPUs or more,
#      python/examples/tiny_m3_tp.py on two GPUs under torchrun.
# Needs python3 with torch (CUDA) and NumPy, cmake and nvcc.  Where cJSON is
# not installed, build-deps/*.deb (libcjson1, libcjson-dev) are unpacked
# and used, as bench/final_round.sh does.  Logs in $OUT (default
# gpu-check-out/): build.log, test_msa.log, test_torch.log, tiny_m3.log,
# test_tp.log, tiny_m3_tp.log, summary.txt.  Exits non-zero when a step fails.
#
# Usage (repository root): OUT=dir python/tests/gpu_check.sh
#        OUT=dir SKIP_BUILD=1 python/tests/gpu_check.sh   (reuse the build)
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-check-out}
# In the tree (build* is ignored), so a later call on a machine still held
# finds it; SKIP_BUILD=1 then reuses it.
BUILD=${BUILD:-$ROOT/build-python-cuda}
ARCHS=${CUDA_ARCHS:-90a-real}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export PATH=/usr/local/cuda/bin:$PATH
export PYTHONUNBUFFERED=1
failed=0

# step NAME LOG LIMIT CMD...: the command's output goes to $OUT/LOG.
step() {
    local name=$1 log=$2 limit=$3
    shift 3
    local t0 rc
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >>"$OUT/$log" 2>&1
    rc=$?
    printf '%-36s %s (%d s)\n' "$name" "$([ $rc = 0 ] && echo ok || echo "FAIL rc=$rc")" \
        $(($(date +%s) - t0)) | tee -a "$SUMMARY"
    [ $rc = 0 ] || failed=1
    return $rc
}

CMAKE_EXTRA=()
if [ ! -e /usr/include/cjson/cJSON.h ] && ls "$ROOT"/build-deps/*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/msa-deps
    for f in "$ROOT"/build-deps/*.deb; do dpkg -x "$f" /tmp/msa-deps; done
    CJ=/tmp/msa-deps/usr
    CMAKE_EXTRA+=("-DCJSON_INCLUDE_DIR=$CJ/include"
                  "-DCJSON_LIBRARY=$CJ/lib/x86_64-linux-gnu/libcjson.so")
    export LD_LIBRARY_PATH="$CJ/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, numpy
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "numpy", numpy.__version__)'
} >>"$SUMMARY" 2>&1

if [ "${SKIP_BUILD:-0}" = 1 ] && [ -e "$BUILD/libmsa.so" ]; then
    echo "build: reusing $BUILD/libmsa.so" | tee -a "$SUMMARY"
else
    step "build libmsa.so (CUDA)" build.log 480 sh -c '
        cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON -DMSA_BUILD_SHARED=ON \
            -DMSA_BUILD_TESTS=OFF -DMSA_BUILD_TOOLS=OFF "-DCMAKE_CUDA_ARCHITECTURES=$3" $4 &&
        cmake --build "$2" -j "$(nproc)"' sh "$ROOT" "$BUILD" "$ARCHS" "${CMAKE_EXTRA[*]}" || {
        tail -30 "$OUT/build.log"
        exit 1
    }
fi
export MSA_LIBRARY=$BUILD/libmsa.so
step "the library has the CUDA backend" test_msa.log 60 python3 -c '
import sys; sys.path.insert(0, "python")
import msa
print(msa.version(), msa.library_path(), "cuda:", msa.backend_available("cuda"))
sys.exit(0 if msa.backend_available("cuda") else 1)'
step "python/tests/test_msa.py" test_msa.log 300 python3 "$ROOT/python/tests/test_msa.py"
step "python/tests/test_torch.py" test_torch.log 420 python3 "$ROOT/python/tests/test_torch.py"
step "tiny_m3.py --device cuda" tiny_m3.log 300 \
    python3 "$ROOT/python/examples/tiny_m3.py" --device cuda --new-tokens 32
step "tiny_m3.py --device cuda, no graphs" tiny_m3.log 300 \
    python3 "$ROOT/python/examples/tiny_m3.py" --device cuda --new-tokens 32 --no-cuda-graph
step "python/tests/test_tp.py" test_tp.log 300 python3 "$ROOT/python/tests/test_tp.py"
if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    step "tiny_m3_tp.py, 2 GPUs (nccl)" tiny_m3_tp.log 300 \
        python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        "$ROOT/python/examples/tiny_m3_tp.py" --device cuda --new-tokens 32
else
    echo "tiny_m3_tp.py, 2 GPUs (nccl)          skipped: fewer than two GPUs" | tee -a "$SUMMARY"
fi
grep -h -E "passed, .* failed|identical tokens|max rel err|tokens/s|^OK|FAILED|kernels" \
    "$OUT"/test_*.log "$OUT"/tiny_m3.log "$OUT"/tiny_m3_tp.log >>"$SUMMARY" 2>/dev/null
cat "$SUMMARY"
exit $failed
