#!/bin/sh
# ptxas' report on CUDA sources: fails when a kernel spills registers to
# local memory or when ptxas serializes warpgroup products ("Potential
# Performance Loss", e.g. a wgmma in a branch it cannot prove uniform).
# Neither shows in the results, only in the time: the Hopper attention runs
# at its 168-register limit, and trial builds whose products ptxas
# serialized were 14-24% slower even on steps that never reached the new
# code (measured on the H200, with other changes beside them).
#
#   check_ptxas.sh NVCC ROOT ARCH FLAGS FILE...
# compiles each FILE (relative to ROOT; CMake passes every src/cuda/**/*.cu)
# for ARCH (e.g. sm_90a), device code
# only, with FLAGS (one argument, split at spaces): the library's Release
# build flags, which CMake passes (tests/cuda/CMakeLists.txt), so a build
# configured with extra CUDA flags checks the code it builds.
set -u
nvcc=$1 root=$2 arch=$3 flags=$4
shift 4
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
bad=0
for f in "$@"; do
    rep="$tmp/report.txt"
    # shellcheck disable=SC2086  # FLAGS: separate words
    if ! "$nvcc" $flags -arch="$arch" -I"$root/include" -I"$root/src" \
        -Xptxas -v -cubin -o "$tmp/out.cubin" "$root/$f" >"$rep" 2>&1; then
        echo "FAIL $f: does not compile"
        cat "$rep"
        bad=1
        continue
    fi
    # "N bytes spill stores, M bytes spill loads" after each function's name.
    spills=$(awk '/Function properties for/ { fn = $NF }
                  /bytes spill stores/ { if ($5 + 0 > 0 || $9 + 0 > 0) print fn ": " $0 }' "$rep")
    serial=$(grep "Potential Performance Loss" "$rep")
    kernels=$(grep -c "Function properties for" "$rep")
    if [ -n "$spills" ] || [ -n "$serial" ]; then
        echo "FAIL $f ($arch):"
        [ -n "$spills" ] && echo "$spills"
        [ -n "$serial" ] && echo "$serial"
        bad=1
    else
        echo "ok   $f ($arch): $kernels functions, no spills, no serialized products"
    fi
done
exit $bad
