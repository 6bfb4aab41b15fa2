#!/bin/sh
# Installs the package with `pip install ./python` into a fresh virtual
# environment (which builds libmsa.so into the wheel) and runs the tests
# from the installed package, outside the source tree.
# Usage: python/tests/check_install.sh [python3] [venv dir]
set -eu
# The package must find the library it installed, not one named here.
unset MSA_LIBRARY
src=$(cd "$(dirname "$0")/../.." && pwd)
python=${1:-python3}
venv=${2:-$(mktemp -d)/venv-msa}
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$src/python"
cd "$(dirname "$venv")"
# The installed package, not the one of the source tree, and its own copy
# of the library, not one of the build folders.
MSA_TEST_INSTALLED=1 "$venv/bin/python" - <<'PY'
import msa, os
path = msa.library_path()
print("installed msa", msa.version(), "at", path)
assert os.sep + "site-packages" + os.sep in path, path
assert os.sep + "_lib" + os.sep in path, path
PY
MSA_TEST_INSTALLED=1 "$venv/bin/python" "$src/python/tests/test_msa.py"
