# ctest -P script: `spattn run` (SPATTN) with files in WORK. --out says what it wrote (it printed nothing); with .npy
# inputs, a shape option that disagrees with the files is refused, naming it (it was silently ignored); one that
# agrees is fine; --seed, which has nothing to draw then, is refused (it was ignored).
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
execute_process(COMMAND ${SPATTN} run --q ${WORK}/x.npy --k ${WORK}/x.npy --v ${WORK}/x.npy --seed 3
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--seed draws random inputs; with --q, --k and --v \\(and --do\\) nothing is random")
  message(FATAL_ERROR "run --q/--k/--v --seed: rc ${rc}, stdout '${out}', stderr '${err}'")
endif()
# The backward: --dq / --dk / --dv say what they wrote (random dO with random inputs); with .npy inputs they need
# --do, and --do alone (no gradient asked) is refused, each naming the options.
execute_process(COMMAND ${SPATTN} run --len 16 --heads 2 --kv-heads 1 --dim 8 --dq ${WORK}/dq.npy --dv ${WORK}/dv.npy
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "wrote [^\n]*dq\\.npy: dQ \\[B, L, H, D\\] = \\[1, 16, 2, 8\\] float32"
   OR NOT out MATCHES "wrote [^\n]*dv\\.npy: dV \\[B, L, HK, Dv\\] = \\[1, 16, 1, 8\\] float32"
   OR NOT out MATCHES "backward cpu_fused_")
  message(FATAL_ERROR "run --dq --dv: rc ${rc}, stdout '${out}', stderr '${err}'")
endif()
execute_process(COMMAND ${SPATTN} run --q ${WORK}/x.npy --k ${WORK}/x.npy --v ${WORK}/x.npy --dq ${WORK}/dq.npy
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--dq, --dk and --dv need --do \\(the gradient of O")
  message(FATAL_ERROR "run --q/--k/--v --dq without --do: rc ${rc}, stdout '${out}', stderr '${err}'")
endif()
execute_process(COMMAND ${SPATTN} run --q ${WORK}/x.npy --k ${WORK}/x.npy --v ${WORK}/x.npy --do ${WORK}/dq.npy
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--do \\(the gradient of O\\) is for --dq, --dk and --dv")
  message(FATAL_ERROR "run --do alone: rc ${rc}, stdout '${out}', stderr '${err}'")
endif()
execute_process(COMMAND ${SPATTN} run --q ${WORK}/x.npy --k ${WORK}/x.npy --v ${WORK}/x.npy --do ${WORK}/dv.npy
                        --dq ${WORK}/dq2.npy
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "do '[^']*dv\\.npy' has shape \\[1, 16, 1, 8\\]; O is \\[1, 16, 2, 8\\]")
  message(FATAL_ERROR "run --do of the wrong shape: rc ${rc}, stdout '${out}', stderr '${err}'")
endif()
# --scale 0 is a scale (uniform attention over each row's keys: O does not depend on q), not the default 1/sqrt(D)
# (it was: the two outputs differed).
execute_process(COMMAND ${SPATTN} run --len 16 --heads 2 --dim 8 --seed 1 --out ${WORK}/y.npy RESULT_VARIABLE rc)
foreach(q x y)
  execute_process(COMMAND ${SPATTN} run --q ${WORK}/${q}.npy --k ${WORK}/x.npy --v ${WORK}/x.npy --scale 0
                          --pattern "local(3)" --out ${WORK}/o_scale0_${q}.npy
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run --scale 0: rc ${rc}, stdout '${out}', stderr '${err}'")
  endif()
  file(SHA256 ${WORK}/o_scale0_${q}.npy sum_${q})
endforeach()
if(NOT sum_x STREQUAL sum_y)
  message(FATAL_ERROR "run --scale 0: O depends on q (scale 0 taken as the default 1/sqrt(D))")
endif()
