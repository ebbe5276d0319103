# ctest's install.out_of_tree_project: installs the optjit build tree BUILD_DIR (component cpp) into a prefix under
# WORK_DIR, configures and builds the user project of this folder against it with CXX, runs it, and runs the
# installed CLI with the project's plugin: UserLion in its counts, and its dump by name.
# Usage: cmake -DBUILD_DIR=... -DWORK_DIR=... -DCXX=... -DSOURCE_DIR=<this folder> -P run_install_test.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${what} failed (${status})")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()
# Fails unless the last run's output matches `regex`.
function(expect what regex)
  if(NOT output MATCHES "${regex}")
    message(FATAL_ERROR "${what}: the output does not match '${regex}'")
  endif()
endfunction()
run("installing optjit" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix --component cpp)
run("configuring the user project" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/app -G Ninja
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run("building the user project" ${CMAKE_COMMAND} --build ${WORK_DIR}/app)
run("running the user project" ${WORK_DIR}/app/lion)
set(cli ${WORK_DIR}/prefix/bin/optjit --plugin ${WORK_DIR}/app/liblion_plugin.so)
run("the CLI's counts with the plugin" ${cli} counts)
expect("counts lists the plugin's optimizer, one kernel per step" "\nUserLion +default +false +1 ")
run("the CLI's dump with the plugin" ${cli} dump --optimizer userlion --set weight_decay=0.1 --stage fused)
expect("dump compiles the plugin's optimizer by name" "fusion of @[A-Za-z_]+: 1 kernel\\(s\\) per step")
