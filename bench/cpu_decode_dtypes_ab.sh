#!/usr/bin/env bash
# Times the CPU decode step (32K, batch 1, sparse layer) with every plane
# format pair, for two builds of `msa` back to back, every CPU kernel
# level, in alternating rounds so that drift of a shared machine hits
# both builds and all formats alike.  bench/cpu_decode_dtypes_summary.py
# prints each format's median time and its ratio to bf16 planes.
#
# Usage: bench/cpu_decode_dtypes_ab.sh OLD_MSA NEW_MSA OUTDIR [ROUNDS]
#   environment: AB_LEVELS (default: avx2 avx512 avx512_bf16), AB_CONTEXT
#   (default 32768), AB_PAIRS (K/V,index pairs; default bf16,bf16
#   fp8_e4m3,fp8_e4m3 bf16,fp8_e4m3 fp8_e4m3,bf16 nvfp4,nvfp4), AB_REPS
#   (default 50)
set -u -o pipefail
old=$1 new=$2 out=$3 rounds=${4:-2}
here=$(cd "$(dirname "$0")" && pwd)
pairs=${AB_PAIRS:-bf16,bf16 fp8_e4m3,fp8_e4m3 bf16,fp8_e4m3 fp8_e4m3,bf16 nvfp4,nvfp4}
mkdir -p "$out"
for r in $(seq "$rounds"); do
    for level in ${AB_LEVELS:-avx2 avx512 avx512_bf16}; do
        for pair in $pairs; do
            kv=${pair%,*} ix=${pair#*,}
            for which in old new; do
                bin=$old
                [ "$which" = new ] && bin=$new
                tag="$which.$level.$kv.$ix.r$r"
                cut -d' ' -f1-3 /proc/loadavg >"$out/$tag.load"
                MSA_CPU_ISA_MAX=$level "$bin" bench --backend cpu \
                    --decode-context "${AB_CONTEXT:-32768}" --batch 1 --reps "${AB_REPS:-50}" \
                    --kv-dtype "$kv" --index-dtype "$ix" --json "$out/$tag.json" \
                    >"$out/$tag.log" 2>&1 || echo "cpu_decode_dtypes_ab: $tag failed (rc $?)"
            done
        done
    done
done
python3 "$here/cpu_decode_dtypes_summary.py" "$out"
