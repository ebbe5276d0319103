# Every C++ source follows the checked-in .clang-format (clang-format 14, Debian 12's: other versions format a few
# constructs differently). Names each file that does not; `clang-format-14 -i FILE` fixes it.
# Usage: cmake -DSOURCE_DIR=<repository root> -DCLANG_FORMAT=<clang-format-14> -P check_format.cmake
cmake_minimum_required(VERSION 3.25)

set(sources "")
foreach(top runtime ir compiler passes codegen frontend tools tests python)
  file(GLOB_RECURSE found "${SOURCE_DIR}/${top}/*.h" "${SOURCE_DIR}/${top}/*.cpp")
  list(APPEND sources ${found})
endforeach()
list(LENGTH sources count)
if(count EQUAL 0)
  message(FATAL_ERROR "no sources found under ${SOURCE_DIR}")
endif()

set(unformatted "")
foreach(source ${sources})
  execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${source} RESULT_VARIABLE status OUTPUT_QUIET
                  ERROR_QUIET)
  if(NOT status EQUAL 0)
    file(RELATIVE_PATH relative "${SOURCE_DIR}" "${source}")
    string(APPEND unformatted "  ${relative}\n")
  endif()
endforeach()
if(unformatted)
  message(FATAL_ERROR "not formatted with .clang-format (run clang-format-14 -i on them):\n${unformatted}")
endif()
message(STATUS "format: ${count} files follow .clang-format")
