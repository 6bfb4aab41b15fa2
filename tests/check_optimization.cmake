# Checks that the build compiles the CPU kernels and the peak probe at -O3
# whatever the build type's or the environment's flags (CMakeLists.txt,
# MSA_C_OPTIMIZE): in each compile command of src/cpu/cpu_level_*.c and
# tools/fmapeak.c the last -O option must be -O3.
#
#   cmake -DCOMMANDS=<build>/compile_commands.json -DCONFIG=<build type>
#         -P check_optimization.cmake
#
# Prints "skipped:" (the test's skip pattern) in a Debug build, which
# keeps -O0, and where the generator wrote no compile_commands.json.
if(CONFIG STREQUAL "Debug")
  message("skipped: a Debug build compiles everything without optimisation")
  return()
endif()
if(NOT EXISTS "${COMMANDS}")
  message("skipped: no ${COMMANDS} (this generator does not write one)")
  return()
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
  foreach(arg IN LISTS args)
    if(arg MATCHES "^-O[0-9sgz]?$")
      set(level "${arg}")
    endif()
  endforeach()
  if(NOT level STREQUAL "-O3")
    list(APPEND bad "${file}: last optimisation option '${level}'")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no compile command of a CPU level file in ${COMMANDS}")
endif()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "kernels not compiled at -O3:\n  ${bad}")
endif()
message("${checked} compile commands end with -O3")
