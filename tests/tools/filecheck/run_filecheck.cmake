# Runs `optjit <RUN-ARGS>` and pipes its output through FileCheck with CHECK_FILE.
file(READ ${CHECK_FILE} check_text)
if(NOT check_text MATCHES "RUN-ARGS: ([^\n]*)")
  message(FATAL_ERROR "${CHECK_FILE} has no RUN-ARGS line")
endif()
# %S in the arguments is the check file's folder (where the inputs it names live).
get_filename_component(check_dir ${CHECK_FILE} DIRECTORY)
string(REPLACE "%S" "${check_dir}" run_line "${CMAKE_MATCH_1}")
separate_arguments(run_args UNIX_COMMAND "${run_line}")
execute_process(COMMAND ${OPTJIT} ${run_args} OUTPUT_VARIABLE output RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "optjit ${run_args} failed with ${status}")
endif()
# One input file per check: ctest runs the checks in parallel from the same directory.
get_filename_component(check_name ${CHECK_FILE} NAME_WE)
set(input ${CMAKE_CURRENT_BINARY_DIR}/filecheck_input.${check_name}.txt)
file(WRITE ${input} "${output}")
execute_process(COMMAND ${FILECHECK} ${CHECK_FILE}
                INPUT_FILE ${input}
                RESULT_VARIABLE check_status)
if(NOT check_status EQUAL 0)
  message(FATAL_ERROR "FileCheck ${CHECK_FILE} failed")
endif()
