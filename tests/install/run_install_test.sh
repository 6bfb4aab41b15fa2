#!/bin/sh
# Installs a build into a temporary prefix, moves the installed tree (both
# the CMake package and msa.pc must work from wherever it lies), then builds
# and runs the examples as an engine would: as a separate CMake project
# through find_package(msa), and with the compilers alone through
# `pkg-config msa`.  Also runs the installed msa program from a directory
# without bench/, so that it must find its workloads beside itself.
#
#   run_install_test.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR CC CXX static|shared PKG_CONFIG|-
#
# Exit 0: every part passed; 77: pkg-config is missing (the rest passed);
# anything else: a failure.
set -eu
cmake=$1 build=$2 src=$3 work=$4 cc=$5 cxx=$6 kind=$7 pkgconfig=$8

step() { echo "== $*"; }
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

rm -rf "$work"
mkdir -p "$work"
step "install into $work/staging"
"$cmake" --install "$build" --prefix "$work/staging" >"$work/install.log" || {
    cat "$work/install.log"
    fail "cmake --install"
}
mv "$work/staging" "$work/prefix"
prefix=$work/prefix

step "installed files"
[ -f "$prefix/include/msa/msa.h" ] || fail "include/msa/msa.h not installed"
libdir=$(dirname "$(find "$prefix" -name 'msaConfig.cmake' | head -n 1)")
libdir=${libdir%/cmake/msa}
[ -f "$libdir/cmake/msa/msaConfigVersion.cmake" ] || fail "msaConfigVersion.cmake not installed"
[ -f "$libdir/pkgconfig/msa.pc" ] || fail "msa.pc not installed"
if [ "$kind" = shared ]; then
    [ -f "$libdir/libmsa.so.0" ] || fail "libmsa.so.0 not installed in $libdir"
    [ ! -e "$libdir/libmsa.a" ] || fail "a shared build installed libmsa.a"
else
    [ -f "$libdir/libmsa.a" ] || fail "libmsa.a not installed in $libdir"
fi
[ ! -e "$libdir/libmsa_internal.a" ] || fail "the tests' internal library was installed"
[ ! -e "$libdir/libmsa_oracle.a" ] || fail "the test kit was installed"
[ -x "$prefix/bin/msa" ] || fail "bin/msa not installed"
[ -f "$prefix/share/msa/workloads/decode.json" ] || fail "share/msa/workloads/decode.json not installed"
[ -f "$prefix/share/msa/workloads/prefill.json" ] || fail "share/msa/workloads/prefill.json not installed"

step "the installed msa program finds its workloads"
mkdir -p "$work/elsewhere"
(cd "$work/elsewhere" && "$prefix/bin/msa" bench --workload decode --cases decode_b8_kv1000 \
    --reps 1 --warmup 0 --threads 2) >"$work/bench.log" 2>&1 || {
    cat "$work/bench.log"
    fail "installed msa bench --workload decode"
}
grep -q decode_b8_kv1000 "$work/bench.log" || fail "the bench ran no case"

step "examples through find_package(msa)"
"$cmake" -S "$src/examples" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DMSA_EXAMPLES_WERROR=ON \
    >"$work/cmake.log" 2>&1 || {
    cat "$work/cmake.log"
    fail "configure the examples"
}
"$cmake" --build "$work/cmake" >>"$work/cmake.log" 2>&1 || {
    cat "$work/cmake.log"
    fail "build the examples"
}
"$work/cmake/minimal" || fail "minimal (find_package)"
"$work/cmake/minimal_cpp" || fail "minimal_cpp (find_package)"

step "msaConfigVersion.cmake"
# msaConfigVersion.cmake: the installed minor version and no other.
mkdir -p "$work/version"
cat >"$work/version/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(msa_version_check LANGUAGES C)
find_package(msa 0.2 CONFIG REQUIRED)
message(STATUS "found msa ${msa_VERSION}")
foreach(v 0.1 0.3 1.0)
  find_package(msa ${v} CONFIG QUIET)
  if(msa_FOUND)
    message(FATAL_ERROR "find_package(msa ${v}) accepted msa ${msa_VERSION}")
  endif()
endforeach()
CM
"$cmake" -S "$work/version" -B "$work/version/build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" >"$work/version.log" 2>&1 || {
    cat "$work/version.log"
    fail "msaConfigVersion.cmake"
}
grep "found msa" "$work/version.log"

if [ "$pkgconfig" = - ] || ! command -v "$pkgconfig" >/dev/null 2>&1; then
    echo "pkg-config not found: the pkg-config build is skipped"
    exit 77
fi
step "examples through pkg-config msa"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
static=
[ "$kind" = static ] && static=--static
cflags=$("$pkgconfig" --cflags msa)
libs=$("$pkgconfig" --libs $static msa)
echo "cflags: $cflags"
echo "libs: $libs"
mkdir -p "$work/pc"
# shellcheck disable=SC2086 # the flags are words
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror $cflags -o "$work/pc/minimal" "$src/examples/minimal.c" $libs ||
    fail "cc minimal.c with pkg-config"
# shellcheck disable=SC2086
"$cxx" -std=c++11 -Wall -Wextra -Wpedantic -Werror $cflags -o "$work/pc/minimal_cpp" \
    "$src/examples/minimal.cpp" $libs || fail "c++ minimal.cpp with pkg-config"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/pc/minimal" || fail "minimal (pkg-config)"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/pc/minimal_cpp" ||
    fail "minimal_cpp (pkg-config)"
echo "install test passed"
