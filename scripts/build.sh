#!/usr/bin/env bash
# Configures and builds libmsa, the `msa` program and the tests in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
