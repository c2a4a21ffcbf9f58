# ctest gpumem_bench_w8_ptx: takes the PTX that SOURCE embeds as R"ptx(...)ptx"
# and assembles it with PTXAS for sm_75 (its .target), sm_80 and sm_90, so that a
# mistake in the hand-written kernel shows here and not first on a GPU's JIT.
file(READ "${SOURCE}" text)
string(FIND "${text}" "R\"ptx(" begin)
string(FIND "${text}" ")ptx\"" end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "${SOURCE} holds no R\"ptx(...)ptx\" literal")
endif()
math(EXPR begin "${begin} + 6")
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${text}" ${begin} ${length} ptx)
file(MAKE_DIRECTORY "${OUT}")
file(WRITE "${OUT}/kernel.ptx" "${ptx}")
foreach(arch sm_75 sm_80 sm_90)
  execute_process(COMMAND "${PTXAS}" -arch=${arch} "${OUT}/kernel.ptx" -o "${OUT}/kernel-${arch}.cubin"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ptxas -arch=${arch} rejects the PTX of ${SOURCE}:\n${out}${err}")
  endif()
endforeach()
message(STATUS "ptxas accepts the PTX of ${SOURCE} for sm_75, sm_80 and sm_90")
