# Tests of the `msa` program (included from the top-level CMakeLists.txt).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME msa_replay
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/replay/run_replay_test.sh
                   $<TARGET_FILE:msa_cli> ${CMAKE_CURRENT_BINARY_DIR}/replay_work)
  set_tests_properties(msa_replay PROPERTIES LABELS quick
                       ENVIRONMENT "PYTHON=${Python3_EXECUTABLE}")
  if(MSA_HAVE_CUDA)
    # The same cases on the GPU (SPEC's replay contract on both backends);
    # "skipped" without a device.
    add_test(NAME msa_replay_cuda
             COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/replay/run_replay_test.sh
                     $<TARGET_FILE:msa_cli> ${CMAKE_CURRENT_BINARY_DIR}/replay_work_cuda cuda)
    set_tests_properties(msa_replay_cuda PROPERTIES LABELS "quick;cuda" SKIP_RETURN_CODE 77
                         ENVIRONMENT "PYTHON=${Python3_EXECUTABLE}")
  endif()
endif()
add_test(NAME msa_info COMMAND msa_cli info)
add_test(NAME msa_check_quick COMMAND msa_cli check --quick)
add_test(NAME msa_demo_small COMMAND msa_cli demo --prefix 1024 --chunk 512)
add_test(NAME msa_bench_smoke COMMAND msa_cli bench --decode-context 4096 --batch 2 --q-len 8 --dense --reps 3 --warmup 1)
# A workload run: one weighted case of the prefill workload, scaled down;
# it must succeed and print the weighted mean time the targets use.
add_test(NAME msa_bench_workload_smoke
         COMMAND sh -c "out=$(\"$0\" bench --workload prefill --workload-file \"$1\" --cases prefill_092e27340df8621a02f0 --max-context 1024 --reps 1 --warmup 0) || exit 1; printf '%s\\n' \"$out\"; printf '%s\\n' \"$out\" | grep -E -q 'weighted mean time, sparse layer: [0-9]+[.][0-9] us'"
                 $<TARGET_FILE:msa_cli> ${CMAKE_CURRENT_SOURCE_DIR}/bench/workloads/prefill.json)
add_test(NAME msa_demo COMMAND msa_cli demo)
set_tests_properties(msa_info msa_check_quick msa_demo_small msa_bench_smoke
                     msa_bench_workload_smoke PROPERTIES LABELS quick)
set_tests_properties(msa_demo PROPERTIES LABELS slow TIMEOUT 600)
# A FIFO named meta.json is refused at once, not waited on (the bound turns
# a wait into a failure).
add_test(NAME msa_replay_fifo
         COMMAND sh -c "d=$(mktemp -d) && mkfifo \"$d/meta.json\" && \"$0\" replay \"$d\"; rc=$?; rm -rf \"$d\"; exit $rc"
                 $<TARGET_FILE:msa_cli>)
set_tests_properties(msa_replay_fifo PROPERTIES LABELS quick TIMEOUT 30
                     PASS_REGULAR_EXPRESSION "meta.json: not a regular file \\(a FIFO\\)")
