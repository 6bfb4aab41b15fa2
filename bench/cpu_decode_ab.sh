#!/usr/bin/env bash
# Times CPU decode steps with two builds of `msa` back to back in one run:
# every CPU kernel level, 32K and 128K contexts, 1 and 8 tokens (sparse
# layer, and the dense layer for 1 token), in alternating rounds so that
# drift of a shared machine hits both builds alike.  Each `msa bench`
# measures the read bandwidth first, so every time is also a share of the
# bandwidth measured in the same process.  The load average is recorded
# before each run.  bench/cpu_decode_summary.py prints the table.
#
# Usage: bench/cpu_decode_ab.sh OLD_MSA NEW_MSA OUTDIR [ROUNDS]
#   environment: AB_LEVELS (default: avx2 avx512 avx512_bf16), AB_CONTEXTS
#   (default: 32768 131072), AB_QLENS (default: 1 8), AB_REPS (default 50)
set -u -o pipefail
old=$1 new=$2 out=$3 rounds=${4:-2}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for r in $(seq "$rounds"); do
    for level in ${AB_LEVELS:-avx2 avx512 avx512_bf16}; do
        for ctx in ${AB_CONTEXTS:-32768 131072}; do
            for q in ${AB_QLENS:-1 8}; do
                for which in old new; do
                    bin=$old
                    [ "$which" = new ] && bin=$new
                    dense=
                    [ "$q" = 1 ] && dense=--dense
                    tag="${which}_${level}_c${ctx}_q${q}_r$r"
                    cut -d' ' -f1-3 /proc/loadavg >"$out/$tag.load"
                    MSA_CPU_ISA_MAX=$level "$bin" bench --backend cpu --decode-context "$ctx" \
                        --batch 1 --q-len "$q" --reps "${AB_REPS:-50}" $dense \
                        --json "$out/$tag.json" >"$out/$tag.log" 2>&1 ||
                        echo "cpu_decode_ab: $tag failed (rc $?)"
                done
            done
        done
    done
done
python3 "$here/cpu_decode_summary.py" "$out"
