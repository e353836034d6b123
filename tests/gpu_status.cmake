# ctest's last words (CTEST_CUSTOM_POST_TEST, written by tests/CMakeLists.txt): whether the GPU tests ran, and why not
# where they did not, so that a plain `ctest` says it without -V. SPATTN: the command; CUDA: whether this build has
# the CUDA kernels (and so the GPU tests).
execute_process(COMMAND ${SPATTN} info OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT CUDA)
  set(line "GPU tests: not built (this build has no CUDA kernels: SPATTN_CUDA=OFF or no nvcc found)")
elseif(out MATCHES "gpus +none \\(([^\n]*)\\)")
  set(line "GPU tests: skipped, ${CMAKE_MATCH_1}")
elseif(out MATCHES "(gpu 0 [^\n]*)")
  set(line "GPU tests: ran on ${CMAKE_MATCH_1}")
else()
  set(line "GPU tests: `spattn info` said: ${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E echo "${line}")
