# Checks the flags the build compiles the CPU kernels with, in its
# compile_commands.json (CMakeLists.txt):
# - outside Debug builds, the last -O option of each CPU level file
#   (src/cpu/cpu_level_*.c) and of the peak probe (tools/fmapeak.c) is -O3,
#   whatever the build type's or the environment's flags (MSA_C_OPTIMIZE);
# - on x86-64 (X86 true), the last -march option of each level file is
#   -march=x86-64, so that a -march=native in CFLAGS does not turn the
#   avx2 or portable level into AVX-512 code.
#
#   cmake -DCOMMANDS=<build>/compile_commands.json -DCONFIG=<build type>
#         -DX86=ON|OFF -P check_kernel_flags.cmake
#
# Prints "skipped:" (the test's skip pattern) where the generator wrote no
# compile_commands.json.
if(NOT EXISTS "${COMMANDS}")
  message("skipped: no ${COMMANDS} (this generator does not write one)")
  return()
endif()
set(check_opt ON)
if(CONFIG STREQUAL "Debug")
  set(check_opt OFF)
  message("Debug build: the optimisation level is not checked (it keeps -O0)")
endif()
file(READ "${COMMANDS}" json)
string(JSON n LENGTH "${json}")
set(checked 0)
set(bad "")
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON file GET "${json}" ${i} file)
  if(NOT file MATCHES "(src/cpu/cpu_level_[a-z0-9]+|tools/fmapeak)\\.c$")
    continue()
  endif()
  string(JSON command ERROR_VARIABLE no_command GET "${json}" ${i} command)
  if(no_command)
    string(JSON command GET "${json}" ${i} arguments)
  endif()
  separate_arguments(args UNIX_COMMAND "${command}")
  set(level "")
  set(march "")
  foreach(arg IN LISTS args)
    if(arg MATCHES "^-O[0-9sgz]?$")
      set(level "${arg}")
    elseif(arg MATCHES "^-march=")
      set(march "${arg}")
    endif()
  endforeach()
  if(check_opt AND NOT level STREQUAL "-O3")
    list(APPEND bad "${file}: last optimisation option '${level}'")
  endif()
  if(X86 AND file MATCHES "cpu_level_(portable|avx2|avx512|avx512bf16)\\.c$"
     AND NOT march STREQUAL "-march=x86-64")
    list(APPEND bad "${file}: last -march option '${march}'")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no compile command of a CPU level file in ${COMMANDS}")
endif()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "CPU kernels with the wrong flags:\n  ${bad}")
endif()
message("${checked} compile commands checked")
