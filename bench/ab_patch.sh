#!/usr/bin/env bash
# Same-run A/B of a source change that has no switch: builds a copy of the
# tree with PATCH applied (patch -p1) beside the round's main build, then
# times each case with both binaries in turns, AB_ROUNDS times (default 2),
# so drift of the machine hits both alike.  Run after a round whose build
# step made $BUILD (bench/gpu_round.sh).
#
# Usage (repository root):  bench/ab_patch.sh PATCH CASE...
#   CASE: batch:context:q_len, or decode-case-id:0:q_len
# Prints one line per case: median µs per round, main | patched.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 2 ] || [ ! -f "$1" ]; then
    echo "usage: bench/ab_patch.sh PATCH CASE...  (CASE: batch:context:q_len or case-id:0:q_len)" >&2
    exit 2
fi
PATCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
BUILD=${BUILD:-/tmp/msa-gpu-build}
SRC=/tmp/msa-ab-patch-src
PBUILD=/tmp/msa-ab-patch-build

rm -rf "$SRC" && mkdir -p "$SRC"
(cd "$ROOT" && tar --exclude=./.git -cf - .) | (cd "$SRC" && tar -xf -)
(cd "$SRC" && patch -s -p1 <"$PATCH") || { echo "ab_patch: $PATCH does not apply"; exit 1; }
BUILD=$PBUILD ROUND_STEPS=build OUT=/tmp/msa-ab-patch-out bash "$SRC/bench/gpu_round.sh" >/dev/null 2>&1
[ -x "$PBUILD/msa" ] || { echo "ab_patch: the patched tree did not build"; exit 1; }

# The round's build links the cJSON it unpacked when the machine has none.
[ -d /tmp/msa-deps/usr/lib/x86_64-linux-gnu ] &&
    export LD_LIBRARY_PATH="/tmp/msa-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

median() { # binary, case
    local b l q
    IFS=: read -r b l q <<<"$2"
    local args=(--decode-context "$l" --batch "$b")
    [[ "$b" == decode_* ]] && args=(--workload decode --cases "$b")
    rm -f /tmp/msa-ab-patch.json
    timeout -k 5 120 "$1" bench --backend cuda "${args[@]}" --q-len "$q" --reps 40 \
        --json /tmp/msa-ab-patch.json >/dev/null 2>&1
    python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["results"][0]["time_us"]["median"])' \
        /tmp/msa-ab-patch.json 2>/dev/null || echo "?"
}

echo "---- A/B: median µs per round, main | with $(basename "$PATCH")"
for c in "$@"; do
    a="" p=""
    for _ in $(seq "${AB_ROUNDS:-2}"); do
        a="$a $(median "$BUILD/msa" "$c")"
        p="$p $(median "$PBUILD/msa" "$c")"
    done
    echo "$c:$a |$p"
done
