# ctest runs each doctest case by name (doctest_discover_tests), and a name with ';', '[' or ']' is cut apart or
# mangled on the way: ctest then runs a filter that matches no case, and doctest reports that as a success. This
# check names every such case so that no test is silently skipped.
# Usage: cmake -DTEST_BINARY=<optjit_tests> -P check_test_names.cmake
cmake_minimum_required(VERSION 3.25)

execute_process(COMMAND ${TEST_BINARY} --list-test-cases --no-version OUTPUT_VARIABLE listing RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${TEST_BINARY} --list-test-cases failed with ${status}")
endif()
# Escape the characters CMake's list syntax would read before splitting into lines.
string(REPLACE ";" "<semicolon>" listing "${listing}")
string(REPLACE "[" "<open>" listing "${listing}")
string(REPLACE "]" "<close>" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")

set(bad "")
set(count 0)
foreach(line IN LISTS lines)
  if(line STREQUAL "" OR line MATCHES "^=+$" OR line MATCHES "^<open>doctest<close>")
    continue()
  endif()
  math(EXPR count "${count} + 1")
  if(line MATCHES "<semicolon>|<open>|<close>")
    string(APPEND bad "  ${line}\n")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "no test cases listed by ${TEST_BINARY}")
endif()
if(bad)
  message(FATAL_ERROR "test case names ctest cannot run by name (drop ';', '[' and ']'):\n${bad}")
endif()
message(STATUS "test names: all ${count} cases can be run by name")
