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
# Known exceptions, by function name (extended regex) and the most bytes of
# spill stores and loads each may show ("REGEX STORES LOADS", entries
# separated by ";"):
# - the Hopper attention's variants for quantized K/V (template argument 1:
#   fp8_e4m3, 2: nvfp4) widen each tile inside the tile loop at the
#   kernel's 168-register limit, and ptxas keeps a few of a unit's values
#   in local memory, stored and loaded once a unit, none inside the tile
#   loop (read in the SASS: 20-36 bytes of stores, 28-56 of loads, each
#   kind of activation); the bf16 variant over fp8 (S on the fp8 products,
#   q_e4m3.cuh) keeps more (56 bytes of stores, 72 of loads) and reloads
#   three words inside the tile loop (read in the SASS); it measured 7%
#   faster than the widening of K and V did (bench/RESULTS.md);
# - the Hopper prefill indexer's consumers (232 registers: two sets of a
#   block's scores and the queries) keep one or two scalars in local
#   memory, loaded about once a page of 8 warpgroup products (read in the
#   SASS: 11 stores and 21 loads in all); at 240 registers the producer,
#   left with 24, spills as much instead.
# Any other spill fails, and so does one of these past its bounds.
allow='^_Z18cu_attn_tma_kernelI11cu_bf16_tagLi1E 56 72;^_Z18cu_attn_tma_kernelI1[01]cu_b?f16_tagLi[12]E 48 64;^_Z14cu_pfit_kernelI1[01]cu_b?f16_tag 48 96'
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
    spills=$(awk -v allow="$allow" '
                  BEGIN { n = split(allow, lines, ";")
                          for (i = 1; i <= n; ++i) {
                              split(lines[i], f, " ")
                              re[i] = f[1]; ms[i] = f[2] + 0; ml[i] = f[3] + 0 } }
                  /Function properties for/ { fn = $NF }
                  /bytes spill stores/ {
                      if ($5 + 0 == 0 && $9 + 0 == 0) next
                      for (i = 1; i <= n; ++i)
                          if (fn ~ re[i] && $5 + 0 <= ms[i] && $9 + 0 <= ml[i]) next
                      print fn ": " $0 }' "$rep")
    serial=$(grep "Potential Performance Loss" "$rep")
    kernels=$(grep -c "Function properties for" "$rep")
    if [ -n "$spills" ] || [ -n "$serial" ]; then
        echo "FAIL $f ($arch):"
        [ -n "$spills" ] && echo "$spills"
        [ -n "$serial" ] && echo "$serial"
        bad=1
    else
        echo "ok   $f ($arch): $kernels functions, no spills beyond the known ones, no serialized products"
    fi
done
exit $bad
