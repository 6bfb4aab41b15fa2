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
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The CUDA toolkit is optional: the CUDA backend is built when nvcc is found.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: nvcc found in /usr/local/cuda/bin (add it to PATH to build the CUDA backend)"
fi
