# ctest -P script: `spattn run` (SPATTN) with files in WORK. --out says what it wrote (it printed nothing); with .npy
# inputs, a shape option that disagrees with the files is refused, naming it (it was silently ignored); one that
# agrees is fine.
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${SPATTN} run --len 16 --heads 2 --dim 8 --out ${WORK}/x.npy
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "wrote [^\n]*x\\.npy: O \\[B, L, H, Dv\\] = \\[1, 16, 2, 8\\] float32")
  message(FATAL_ERROR "run --out: rc ${rc}, stdout '${out}', stderr '${err}'")
endif()
execute_process(COMMAND ${SPATTN} run --q ${WORK}/x.npy --k ${WORK}/x.npy --v ${WORK}/x.npy --batch 3
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--batch 3 disagrees with the .npy inputs \\(1\\)")
  message(FATAL_ERROR "run --q/--k/--v --batch 3: rc ${rc}, stdout '${out}', stderr '${err}'")
endif()
execute_process(COMMAND ${SPATTN} run --q ${WORK}/x.npy --k ${WORK}/x.npy --v ${WORK}/x.npy --batch 1 --len 16 --dim 8
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "run --q/--k/--v with matching shape options: rc ${rc}, stderr '${err}'")
endif()
