# ctest gpumem_bench_smoke: gpumem-bench --quick on W3 and W5 (four rows, the
# logs in bench/traces) with --plot and --json, then checks that it exited 0,
# that every chart is a complete SVG with a line in it, that the JSON names
# both workloads, and that the default resource keeps W5's memory ceiling on
# every log (peak reserved / peak live <= 1.10; no allocation failed with 1.10 x
# the peak live bytes free), and that no row reserved less than the peak live
# bytes; then W8,
# whose cells the simulator skips. Run by
# ctest with GPUMEM_BACKEND=sim; BENCH and OUT are given.
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(
  COMMAND "${BENCH}" --quick --workloads W3,W5
          --subjects "gpumem default,gpumem pool_resource,gpumem cuda_resource,cuMemAllocAsync"
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
# W3's chart and one per log in bench/traces.
file(GLOB logs "${CMAKE_CURRENT_LIST_DIR}/traces/*.csv")
list(LENGTH logs expected)
math(EXPR expected "${expected} + 1")
if(n LESS expected)
  message(FATAL_ERROR "expected ${expected} charts in ${OUT}/plots (W3 and one per log), found ${n}: ${charts}")
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

# The default resource's W5 memory figures, from the JSON (docs/benchmarks.md, W5).
string(JSON workloads LENGTH "${json}" workloads)
math(EXPR last_workload "${workloads} - 1")
set(checked 0)
foreach(w RANGE ${last_workload})
  string(JSON id GET "${json}" workloads ${w} id)
  if(NOT id STREQUAL "W5")
    continue()
  endif()
  string(JSON columns LENGTH "${json}" workloads ${w} columns)
  string(JSON subjects LENGTH "${json}" workloads ${w} subjects)
  math(EXPR last_column "${columns} - 1")
  math(EXPR last_subject "${subjects} - 1")
  foreach(s RANGE ${last_subject})
    string(JSON name GET "${json}" workloads ${w} subjects ${s} name)
    # Physical sense, every row: a resource cannot hold less than what is live
    # (0.99: the peaks are sampled, not exact).
    foreach(c RANGE ${last_column})
      string(JSON group GET "${json}" workloads ${w} columns ${c} group)
      string(JSON status GET "${json}" workloads ${w} subjects ${s} results ${c} status)
      if(group STREQUAL "peak reserved / peak live" AND status STREQUAL "ok")
        string(JSON value GET "${json}" workloads ${w} subjects ${s} results ${c} median)
        if(value LESS 0.99)
          string(JSON log GET "${json}" workloads ${w} columns ${c} variant)
          message(FATAL_ERROR "W5 ${log}: ${name} reserved ${value} x the peak live bytes: below what is live")
        endif()
      endif()
    endforeach()
    if(NOT name STREQUAL "gpumem default")
      continue()
    endif()
    foreach(c RANGE ${last_column})
      string(JSON group GET "${json}" workloads ${w} columns ${c} group)
      string(JSON log GET "${json}" workloads ${w} columns ${c} variant)
      string(JSON status GET "${json}" workloads ${w} subjects ${s} results ${c} status)
      if(NOT status STREQUAL "ok")
        message(FATAL_ERROR "W5 ${group}, ${log}: the default resource's cell is ${status}")
      endif()
      string(JSON value GET "${json}" workloads ${w} subjects ${s} results ${c} median)
      # The target, held on every log: 1.10 x the peak live bytes.
      if(group STREQUAL "peak reserved / peak live" AND value GREATER 1.10)
        message(FATAL_ERROR "W5 ${log}: the default resource reserved ${value} x the peak live bytes (target 1.10)")
      elseif(group MATCHES "^failed allocations" AND value GREATER 0)
        message(FATAL_ERROR "W5 ${log}: ${value} allocations of the default resource failed with 1.10 x the peak live bytes free")
      endif()
      math(EXPR checked "${checked} + 1")
    endforeach()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no W5 figures of the default resource in ${OUT}/bench.json")
endif()
message(STATUS "gpumem-bench smoke run: the default resource keeps W5's memory ceiling and fails nothing (${checked} cells)")

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
