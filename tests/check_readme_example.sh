#!/bin/sh
# The README's program is examples/minimal.c, character for character (the
# tests build and run the file, so the README shows a program that works).
#
#   check_readme_example.sh README.md examples/minimal.c
set -eu
readme=$1 example=$2
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
# The first ```c block of the README.
awk '/^```c$/ && !done { inside = 1; next } /^```$/ && inside { inside = 0; done = 1 } inside' \
    "$readme" >"$tmp"
[ -s "$tmp" ] || {
    echo "FAIL: no \`\`\`c block in $readme"
    exit 1
}
if ! diff -u "$example" "$tmp"; then
    echo "FAIL: the README's C program differs from $example (diff above)"
    exit 1
fi
echo "the README's program is $example ($(wc -l <"$tmp") lines)"
