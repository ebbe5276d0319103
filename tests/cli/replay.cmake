# optjit replay --mode all over every golden case of the implemented optimizers: all pass, exit status 0, and the last line
# counts them; a case of an optimizer not implemented yet fails with a clear message and a non-zero status.
file(GLOB cases ${GOLDEN}/adam_*.json ${GOLDEN}/adamw_*.json ${GOLDEN}/sgd_*.json ${GOLDEN}/adamax_*.json
     ${GOLDEN}/adagrad_*.json ${GOLDEN}/rmsprop_*.json ${GOLDEN}/adadelta_*.json)
list(LENGTH cases count)
math(EXPR expected "${count} * 3")
execute_process(COMMAND ${OPTJIT} replay --mode all ${cases} OUTPUT_VARIABLE out RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "replay failed (${status}):\n${out}")
endif()
if(NOT out MATCHES "\n${expected} passed, 0 failed\n$")
  message(FATAL_ERROR "unexpected last line, wanted '${expected} passed, 0 failed':\n${out}")
endif()
if(NOT out MATCHES "PASS adam_defaults_foreach \\[compiled\\]  compiles=[0-9]+ recompiles=[0-9]+ rebinds=[0-9]+ kernels=[0-9]+\n")
  message(FATAL_ERROR "compiled mode must report its metrics:\n${out}")
endif()
execute_process(COMMAND ${OPTJIT} replay --mode compiled ${GOLDEN}/rprop_defaults_single.json
                OUTPUT_VARIABLE out RESULT_VARIABLE status)
if(status EQUAL 0 OR NOT out MATCHES "FAIL rprop_defaults_single: optimizer Rprop is not implemented")
  message(FATAL_ERROR "an unimplemented optimizer must fail clearly (${status}):\n${out}")
endif()
