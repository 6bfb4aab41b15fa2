#!/bin/sh
# Runs `msa replay` on the cases of make_case.py and checks every result.
#   usage: run_replay_test.sh MSA_PROGRAM WORK_DIR [cpu|cuda]
# Good cases must match the double-precision reference of replay_ref.py; bad
# cases must be refused with the expected status, exit code 2, and no output
# file besides out_status.json, even where stale outputs of an earlier run
# were lying in the directory.
set -u
msa=$1
work=$2
backend=${3:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

# Without a usable device for the backend the test is skipped (CTest's
# skip code), never passed.
if [ "$backend" != cpu ] && ! "$msa" info | grep -q "^backend $backend *available"; then
    echo "skipped: no usable $backend backend ($("$msa" info | grep "^backend $backend"))"
    exit 77
fi

rm -rf "$work"
mkdir -p "$work"
"$python" "$here/make_case.py" "$work" || exit 1

failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

for dir in "$work"/*/; do
    dir=${dir%/}
    name=$(basename "$dir")
    if [ -f "$dir/expect_error" ]; then
        # Outputs of an earlier successful run must not survive a rejected one.
        for f in out_o.npy out_lse.npy out_topk.npy out_idx_o.npy out_status.json; do
            echo stale > "$dir/$f"
        done
        "$msa" replay "$dir" --backend "$backend" > "$dir/stdout.txt" 2> "$dir/stderr.txt"
        rc=$?
        [ "$rc" -eq 2 ] || fail "$name: exit code $rc, expected 2 ($(cat "$dir/stderr.txt"))"
    else
        "$msa" replay "$dir" --backend "$backend" > "$dir/stdout.txt" 2> "$dir/stderr.txt"
        rc=$?
        [ "$rc" -eq 0 ] || fail "$name: exit code $rc ($(cat "$dir/stderr.txt"))"
    fi
    "$python" "$here/check.py" "$dir" || fail "$name: outputs"
done

# A second run over finished outputs must give the same result.
"$msa" replay "$work/sparse_max" --backend "$backend" > /dev/null 2>&1 || fail "sparse_max: rerun"
"$python" "$here/check.py" "$work/sparse_max" || fail "sparse_max: rerun outputs"

# Usage errors: no directory, unknown option.
"$msa" replay > /dev/null 2>&1
[ $? -eq 2 ] || fail "replay without a directory should exit 2"
"$msa" replay "$work/sparse_max" --bogus > /dev/null 2>&1
[ $? -eq 2 ] || fail "replay with an unknown option should exit 2"

if [ "$failures" -ne 0 ]; then
    echo "$failures replay check(s) failed"
    exit 1
fi
echo "all replay checks passed"
