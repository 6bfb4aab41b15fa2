#!/bin/sh
# Configures, builds and runs tests/subproject (libmsa inside an engine's
# build tree).
#
#   run_subproject_test.sh CMAKE SOURCE_DIR WORK_DIR CC
set -eu
cmake=$1 src=$2 work=$3 cc=$4
rm -rf "$work"
"$cmake" -S "$src/tests/subproject" -B "$work" -DMSA_SOURCE_DIR="$src" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_BUILD_TYPE=Release >"$work.log" 2>&1 || {
    cat "$work.log"
    echo "FAIL: configure the consumer"
    exit 1
}
"$cmake" --build "$work" -j 2 >>"$work.log" 2>&1 || {
    cat "$work.log"
    echo "FAIL: build the consumer"
    exit 1
}
targets=$("$cmake" --build "$work" --target help | sed -n 's/^\.\.\. \([a-z_]*\).*/\1/p' | tr '\n' ' ')
echo "targets: $targets"
"$work/consumer"
echo "subproject test passed"
