#!/bin/sh
# The shared library exports exactly the functions that include/msa/msa.h
# declares with MSA_API: no internal function, nothing of the static
# libraries linked into it (the CUDA runtime), and no public one missing.
#
#   check_exports.sh LIBMSA_SO HEADER
#   check_exports.sh - HEADER      the header alone (every build)
set -eu
lib=$1 header=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -n 's/^MSA_API .*[ *]\(msa_[a-z0-9_]*\)(.*/\1/p' "$header" | sort -u >"$tmp/declared"
[ -s "$tmp/declared" ] || {
    echo "FAIL: no MSA_API declaration found in $header"
    exit 1
}
# A function declared without the mark would be hidden from the shared library.
unmarked=$(grep -n '^[a-z_][a-z0-9_ *]*[ *]msa_[a-z0-9_]*(' "$header" | grep -v 'typedef' || true)
if [ -n "$unmarked" ]; then
    echo "FAIL: declarations without MSA_API:"
    echo "$unmarked"
    exit 1
fi
if [ "$lib" = - ]; then
    echo "$(wc -l <"$tmp/declared") functions declared, each with MSA_API"
    exit 0
fi
command -v nm >/dev/null 2>&1 || {
    echo "nm not found: skipped"
    exit 77
}
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/exported"
echo "$(wc -l <"$tmp/exported") symbols exported, $(wc -l <"$tmp/declared") functions declared with MSA_API"
if ! diff "$tmp/declared" "$tmp/exported" >"$tmp/diff"; then
    echo "FAIL: exported symbols differ from the header's MSA_API functions (< header only, > library only):"
    cat "$tmp/diff"
    exit 1
fi
soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
echo "SONAME: $soname"
case "$soname" in
libmsa.so.[0-9]*) ;;
*)
    echo "FAIL: SONAME '$soname' is not libmsa.so.<ABI version>"
    exit 1
    ;;
esac
echo "exports match"
