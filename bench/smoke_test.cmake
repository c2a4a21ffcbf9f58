# ctest gpumem_bench_smoke: gpumem-bench --quick on W3 and W5 (three rows, the
# logs in bench/traces) with --plot and --json, then checks that it exited 0,
# that every chart is a complete SVG with a line in it, and that the JSON names
# both workloads; then W8, whose cells the simulator skips. Run by ctest with
# GPUMEM_BACKEND=sim; BENCH and OUT are given.
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(
  COMMAND "${BENCH}" --quick --workloads W3,W5
          --subjects "gpumem pool_resource,gpumem cuda_resource,cuMemAllocAsync"
          --plot "${OUT}/plots" --json "${OUT}/bench.json"
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
file(WRITE "${OUT}/stdout.txt" "${stdout}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gpumem-bench exited ${rc}\n${stdout}\n${stderr}")
endif()
foreach(title "W3 threads on" "W5 replay: time (us per call) on" "W5 replay: peak reserved / peak live on")
  string(FIND "${stdout}" "${title}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "no table '${title}' in the output:\n${stdout}")
  endif()
endforeach()
file(GLOB charts "${OUT}/plots/*.svg")
list(LENGTH charts n)
# W3's chart and one per log in bench/traces (three).
if(n LESS 4)
  message(FATAL_ERROR "expected at least 4 charts in ${OUT}/plots, found ${n}: ${charts}")
endif()
foreach(chart IN LISTS charts)
  file(READ "${chart}" svg)
  string(FIND "${svg}" "<svg xmlns=\"http://www.w3.org/2000/svg\"" head)
  string(FIND "${svg}" "</svg>" tail)
  string(FIND "${svg}" "<polyline" line)
  if(NOT head EQUAL 0 OR tail EQUAL -1 OR line EQUAL -1)
    message(FATAL_ERROR "${chart} is not a complete SVG chart with a line in it")
  endif()
endforeach()
file(READ "${OUT}/bench.json" json)
foreach(key "\"id\": \"W3\"" "\"id\": \"W5\"" "\"curves\": [")
  string(FIND "${json}" "${key}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${OUT}/bench.json lacks ${key}")
  endif()
endforeach()
message(STATUS "gpumem-bench smoke run: ${n} charts, JSON with W3 and W5")

# W8 launches kernels, which the simulator does not run: its cells are skipped,
# saying why, and the run still succeeds.
execute_process(
  COMMAND "${BENCH}" --quick --workloads W8 --subjects "gpumem pool_resource"
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gpumem-bench --workloads W8 exited ${rc}\n${stdout}\n${stderr}")
endif()
string(FIND "${stdout}" "needs a GPU (kernels)" at)
if(at EQUAL -1)
  message(FATAL_ERROR "W8 on the simulator does not say that it needs a GPU:\n${stdout}")
endif()
message(STATUS "gpumem-bench smoke run: W8 skipped on the simulator, saying why")
