# The internal API (docs/architecture.md, "The internal API"): python/, bench/ and
# tools/ may include exactly these private headers of src/; anything else there is
# the library's own. Run as: cmake -DROOT=<source dir> -P internal_api_check.cmake
cmake_policy(SET CMP0057 NEW)
set(allowed "driver/driver.hpp;adaptors/log_format.hpp")
set(bad "")
foreach(dir python/src bench tools)
  file(GLOB_RECURSE sources "${ROOT}/${dir}/*.cpp" "${ROOT}/${dir}/*.hpp" "${ROOT}/${dir}/*.cu")
  foreach(source IN LISTS sources)
    file(STRINGS "${source}" includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"[^\"]+\"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*" "\\1" header "${line}")
      if(EXISTS "${ROOT}/src/${header}" AND NOT header IN_LIST allowed)
        file(RELATIVE_PATH where "${ROOT}" "${source}")
        list(APPEND bad "${where}: ${header}")
      endif()
    endforeach()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " bad)
  message(FATAL_ERROR "private headers of src/ outside the internal API (${allowed}):\n  ${bad}\n"
                      "Use a public header, or add the header to the internal API on purpose "
                      "(docs/architecture.md).")
endif()
message(STATUS "python/, bench/ and tools/ include only the internal API of src/: ${allowed}")
