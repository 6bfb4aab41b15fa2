#!/usr/bin/env bash
# The main job: build, then run `msa demo` on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec ./build/msa demo "$@"
