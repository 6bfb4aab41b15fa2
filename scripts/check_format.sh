#!/usr/bin/env bash
# Checks that the C and CUDA sources follow .clang-format; changes nothing.
#
#   scripts/check_format.sh            every tracked *.c *.h *.cu *.cuh
#   scripts/check_format.sh FILE...    these files only
#
# Exits 0 when no file needs formatting, 1 when some do (each is named on
# stderr), 2 when clang-format or a named file is missing.  CLANG_FORMAT
# names the program (default: clang-format).  The options in .clang-format
# are known to clang-format 14 and later; another major version may place a
# few lines differently, so CI should use one fixed version.
set -uo pipefail
cd "$(dirname "$0")/.."

cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
    echo "check_format: $cf not found (install clang-format or set CLANG_FORMAT)" >&2
    exit 2
fi

if [ "$#" -gt 0 ]; then
    files=("$@")
elif git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh')
else
    mapfile -t files < <(find src include tests tools bench -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
fi

bad=0
for f in "${files[@]}"; do
    if [ ! -f "$f" ]; then
        echo "check_format: no such file: $f" >&2
        exit 2
    fi
    if ! "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
        echo "needs formatting: $f" >&2
        bad=$((bad + 1))
    fi
done

if [ "$bad" -gt 0 ]; then
    echo "check_format: $bad of ${#files[@]} files need formatting ($cf -i FILE fixes one)" >&2
    exit 1
fi
echo "check_format: all ${#files[@]} checked files are formatted"
