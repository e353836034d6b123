# ctest -P script: installs the build tree (BUILD) to a scratch prefix under WORK, then configures, builds and runs
# the consumer of tests/install/consumer against it with the generator GEN.
file(REMOVE_RECURSE ${WORK})
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD};--prefix;${WORK}/prefix"
    "${CMAKE_COMMAND};-S;${SRC}/tests/install/consumer;-B;${WORK}/consumer;-G;${GEN};-DCMAKE_PREFIX_PATH=${WORK}/prefix"
    "${CMAKE_COMMAND};--build;${WORK}/consumer"
    "${WORK}/consumer/consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install check failed at: ${step}\n${out}")
  endif()
endforeach()
message(STATUS "installed package: consumer built and ran")
