# ctest gpumem_bench_rounds: gpumem-bench --rounds 2 on W1 and W5 (one log), two
# rows, with --json; checks that the JSON says 2 rounds, that every measured cell
# holds both rounds' repetitions (W1: 2 x --reps unless cut to fit the budget;
# W5: its time, memory and failure cells one set per round, as many in each
# unless cut to fit the budget). A --rounds outside
# 1-100 is tools/CMakeLists.txt's gpumem-bench.cli.rounds_out_of_range. Run by
# ctest with GPUMEM_BACKEND=sim; BENCH, OUT and TRACE are given.
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(
  COMMAND "${BENCH}" --quick --reps 3 --rounds 2 --workloads W1,W5 --traces "${TRACE}"
          --subjects "gpumem default,gpumem pool_resource" --json "${OUT}/bench.json"
  RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gpumem-bench --rounds 2 exited ${rc}\n${stdout}\n${stderr}")
endif()
string(FIND "${stdout}" "in 2 rounds over the rows" said)
if(said EQUAL -1)
  message(FATAL_ERROR "the tables do not say that the figures come from 2 rounds:\n${stdout}")
endif()
file(READ "${OUT}/bench.json" json)
string(JSON rounds GET "${json}" options rounds)
if(NOT rounds EQUAL 2)
  message(FATAL_ERROR "the JSON's options say ${rounds} rounds, not 2")
endif()
string(JSON workloads LENGTH "${json}" workloads)
set(checked 0)
math(EXPR last_w "${workloads} - 1")
foreach(w RANGE ${last_w})
  string(JSON id GET "${json}" workloads ${w} id)
  string(JSON subjects LENGTH "${json}" workloads ${w} subjects)
  string(JSON columns LENGTH "${json}" workloads ${w} columns)
  math(EXPR last_s "${subjects} - 1")
  math(EXPR last_c "${columns} - 1")
  foreach(s RANGE ${last_s})
    string(JSON name GET "${json}" workloads ${w} subjects ${s} name)
    foreach(c RANGE ${last_c})
      string(JSON status GET "${json}" workloads ${w} subjects ${s} results ${c} status)
      if(NOT status STREQUAL "ok")
        message(FATAL_ERROR "${id} ${name}, column ${c}: ${status}")
      endif()
      string(JSON n LENGTH "${json}" workloads ${w} subjects ${s} results ${c} reps)
      string(JSON cut ERROR_VARIABLE no_cut GET "${json}" workloads ${w} subjects ${s} results ${c} cut_by_budget)
      # A cell cut to fit the budget may keep fewer repetitions in one round than
      # in the other (a busy host); one that was not keeps as many in each.
      math(EXPR odd "${n} % 2")
      if(n LESS 2 OR (no_cut AND NOT odd EQUAL 0))
        message(FATAL_ERROR "${id} ${name}, column ${c}: ${n} repetitions, not one set per round of 2")
      endif()
      if(id STREQUAL "W1" AND no_cut AND NOT n EQUAL 6)
        message(FATAL_ERROR "W1 ${name}, column ${c}: ${n} repetitions, not 2 rounds x 3")
      endif()
      math(EXPR checked "${checked} + 1")
    endforeach()
  endforeach()
endforeach()
if(checked LESS 10)
  message(FATAL_ERROR "only ${checked} cells checked: W1 or W5 did not run")
endif()
message(STATUS "gpumem-bench --rounds 2: ${checked} cells, each with both rounds' repetitions")
