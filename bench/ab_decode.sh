#!/usr/bin/env bash
# Times the decode workload with two builds of `msa` in the same run, in
# alternating rounds, so that drift of the machine hits both alike, and
# prints each case's median per build and their ratio (bench/ab_compare.py).
#
# Usage: bench/ab_decode.sh OLD_MSA NEW_MSA OUTDIR [ROUNDS]
#   environment: AB_QLENS (default "8 1"), AB_SUITE (default full)
set -u -o pipefail
old=$1 new=$2 out=$3 rounds=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for q in ${AB_QLENS:-8 1}; do
    for r in $(seq "$rounds"); do
        for which in old new; do
            bin=$old
            [ "$which" = new ] && bin=$new
            "$bin" bench --backend cuda --workload decode --workload-file "$here/workloads/decode.json" \
                --suite "${AB_SUITE:-full}" --q-len "$q" \
                --json "$out/ab_${which}_q${q}_r$r.json" >"$out/ab_${which}_q${q}_r$r.log" 2>&1 ||
                echo "ab: $which q$q round $r failed (rc $?)"
        done
    done
    python3 "$here/ab_compare.py" "$out" "$q"
done
