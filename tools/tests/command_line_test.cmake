# One command-line case of a tool (ctest *.cli.*, tools/CMakeLists.txt): runs
#   EXE ARGS...   (ARGS: the arguments, separated by '|')
# and checks its exit status (EXPECT_STATUS) and that what it printed, stdout and
# stderr together, matches the regular expression EXPECT_OUTPUT. In ARGS, %OUT%
# stands for a scratch folder of this case; with EXPECT_JSON_KEY, %OUT%/out.json
# must be a JSON document with that top-level key.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
string(REPLACE "%OUT%" "${OUT}" args "${ARGS}")
string(REPLACE "|" ";" args "${args}")
execute_process(COMMAND "${EXE}" ${args}
                RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(NOT status STREQUAL "${EXPECT_STATUS}")
  message(FATAL_ERROR "${EXE} ${args}: exit status ${status}, expected ${EXPECT_STATUS}:\n${output}")
endif()
if(NOT output MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "${EXE} ${args}: the output does not match '${EXPECT_OUTPUT}':\n${output}")
endif()
if(EXPECT_JSON_KEY)
  file(READ "${OUT}/out.json" json)
  string(JSON value ERROR_VARIABLE error GET "${json}" "${EXPECT_JSON_KEY}")
  if(error)
    message(FATAL_ERROR "${OUT}/out.json: ${error}")
  endif()
  message(STATUS "${EXPECT_JSON_KEY}: ${value}")
endif()
message(STATUS "${EXE} ${args}: exit status ${status}, as expected")
