# Cross-compiles for Linux on Arm64 with Debian's gcc-aarch64-linux-gnu and
# libc6-dev-arm64-cross; ctest runs the test programs under qemu-aarch64
# with the target's C library (qemu-user).  The CPU backend only: no CUDA.
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)

# Headers and libraries come from the target's root only, so the build
# machine's own (x86-64) cJSON is not taken for the target's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# -cpu max: the emulated CPU has every extension qemu implements, FEAT_BF16
# among them, so the tests run the neon_bf16 level as well as neon.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-cpu;max;-L;/usr/aarch64-linux-gnu)
set(MSA_CUDA OFF CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON, OFF")
