# The command-line tools' and gpumem-bench's own dependencies, both header-only and
# never the library's: CLI11 parses their command lines, nlohmann/json writes their
# JSON. Debian and Ubuntu ship both with CMake package files (libcli11-dev,
# nlohmann-json3-dev; scripts/bootstrap installs them); installed elsewhere, point
# CLI11_ROOT / nlohmann_json_ROOT (or CMAKE_PREFIX_PATH) at their prefix.
if(TARGET CLI11::CLI11 AND TARGET nlohmann_json::nlohmann_json)
  return()
endif()
find_package(CLI11 CONFIG QUIET)
find_package(nlohmann_json 3 CONFIG QUIET)
set(_gpumem_missing "")
if(NOT CLI11_FOUND)
  list(APPEND _gpumem_missing "CLI11 (Debian/Ubuntu package libcli11-dev)")
endif()
if(NOT nlohmann_json_FOUND)
  list(APPEND _gpumem_missing "nlohmann/json 3 (Debian/Ubuntu package nlohmann-json3-dev)")
endif()
if(_gpumem_missing)
  list(JOIN _gpumem_missing " and " _gpumem_missing)
  # A pip build (scikit-build-core sets SKBUILD) needs the library and the binding;
  # the bundled tools are a convenience: without their packages the wheel comes
  # without them (the console scripts then say so), rather than no wheel at all.
  if(DEFINED SKBUILD AND NOT GPUMEM_BUILD_BENCH)
    message(WARNING
      "gpumem: ${_gpumem_missing} not found: the wheel is built without gpumem-report and "
      "gpumem-replay. Install them (scripts/bootstrap does) and reinstall to bundle the tools.")
    set(GPUMEM_BUILD_TOOLS OFF)
    return()
  endif()
  message(FATAL_ERROR
    "gpumem's tools and gpumem-bench need ${_gpumem_missing}, not found here. "
    "scripts/bootstrap installs what is missing; installed elsewhere, set CLI11_ROOT / "
    "nlohmann_json_ROOT to its prefix. "
    "The library alone builds without: -DGPUMEM_BUILD_TOOLS=OFF -DGPUMEM_BUILD_BENCH=OFF "
    "(for pip: -Ccmake.define.GPUMEM_BUILD_TOOLS=OFF).")
endif()
message(STATUS "gpumem tools: CLI11 ${CLI11_VERSION}, nlohmann/json ${nlohmann_json_VERSION}")
