#!/usr/bin/env bash
# Builds the four fuzzers (clang, ASan + UBSan) and runs each for SECONDS:
# fuzz_config, fuzz_step, fuzz_npy, fuzz_meta (4 x SECONDS in all).
#   tests/fuzz/run_fuzzers.sh [SECONDS]      default 30
# Environment: MSA_FUZZ_BUILD (build folder, default build-fuzz).
# The seed corpora are copied to a scratch folder first, so new inputs the
# fuzzer finds never land in the source tree; crashes are written to the
# current folder (crash-*), as libFuzzer does.
set -euo pipefail

secs=${1:-30}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${MSA_FUZZ_BUILD:-$root/build-fuzz}

CC=clang cmake -S "$root" -B "$build" -DMSA_FUZZ=ON -DMSA_SANITIZE=ON \
  -DBUILD_TESTING=OFF -DMSA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz_config fuzz_step fuzz_npy fuzz_meta -j "$(nproc)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$here/corpus_config" "$work/config"
cp -r "$here/corpus_step" "$work/step"
cp -r "$here/corpus_npy" "$work/npy"
cp -r "$here/corpus_meta" "$work/meta"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
echo "== fuzz_config (${secs}s)"
"$build/tests/fuzz/fuzz_config" -max_total_time="$secs" -max_len=16384 \
  -dict="$here/config.dict" "$work/config" || status=1
echo "== fuzz_step (${secs}s)"
"$build/tests/fuzz/fuzz_step" -max_total_time="$secs" -max_len=512 "$work/step" || status=1
echo "== fuzz_npy (${secs}s)"
"$build/tests/fuzz/fuzz_npy" -max_total_time="$secs" -max_len=8192 \
  -dict="$here/npy.dict" "$work/npy" || status=1
echo "== fuzz_meta (${secs}s)"
"$build/tests/fuzz/fuzz_meta" -max_total_time="$secs" -max_len=8192 \
  -dict="$here/meta.dict" "$work/meta" || status=1

if [ "$status" -eq 0 ]; then
  echo "4 passed, 0 failed"
else
  echo "fuzzing found a problem (see crash-* files)"
  exit 1
fi
