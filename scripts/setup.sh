#!/usr/bin/env bash
# Installs what the build needs on a fresh Debian 12 machine (idempotent).
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(gcc)
# The C++ example and the pkg-config build of the examples (tests).
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v make >/dev/null 2>&1 || need+=(make)
command -v python3 >/dev/null 2>&1 || need+=(python3)
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
if [ "${MSA_WITH_FUZZ:-0}" = 1 ]; then
  command -v clang >/dev/null 2>&1 || need+=(clang)
  dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
  command -v clang-format >/dev/null 2>&1 || need+=(clang-format)
fi
# The Arm64 cross build of CI: Debian's cross compiler and C library, and
# qemu-aarch64 to run its tests.
if [ "${MSA_WITH_ARM64:-0}" = 1 ]; then
  command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
  dpkg -s libc6-dev-arm64-cross >/dev/null 2>&1 || need+=(libc6-dev-arm64-cross)
  command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The Python package's tests (python/): NumPy for the python3 on PATH (the
# interpreter CMake finds), from PyPI with pip; where pip may not install
# into that interpreter (Debian's own python3), Debian's package.  venv
# (with ensurepip) for the test that installs the package into a fresh
# environment.
if command -v python3 >/dev/null 2>&1; then
  py_need=()
  if ! python3 -c 'import numpy' >/dev/null 2>&1; then
    echo "setup: installing numpy"
    python3 -m pip install -q numpy >/dev/null 2>&1 || py_need+=(python3-numpy)
  fi
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || py_need+=(python3-venv)
  if [ ${#py_need[@]} -gt 0 ]; then
    echo "setup: installing ${py_need[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${py_need[@]}" >/dev/null
  fi
fi
# PyTorch for the package's torch tests (test_python_torch), only when
# MSA_WITH_TORCH=1: PyPI serves Linux x86-64 torch with its CUDA libraries
# (about 5.4 GB installed, 1.5 minutes here); without torch those tests
# report skipped.
if [ "${MSA_WITH_TORCH:-0}" = 1 ] && command -v python3 >/dev/null 2>&1 &&
   ! python3 -c 'import torch' >/dev/null 2>&1; then
  echo "setup: installing torch"
  python3 -m pip install -q torch >/dev/null ||
    echo "setup: torch could not be installed: the torch tests will report skipped"
fi
# The CUDA toolkit is optional: the CUDA backend is built when nvcc is found.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: nvcc found in /usr/local/cuda/bin (add it to PATH to build the CUDA backend)"
fi
