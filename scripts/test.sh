#!/usr/bin/env bash
# Build, then run every test with CTest (GPU tests report "skipped" without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
