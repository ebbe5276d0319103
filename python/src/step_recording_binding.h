// Binds optjit::StepRecording for the Python recorder of step functions.
#pragma once

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace optjit::python {

void bind_step_recording(nb::module_& m);

} // namespace optjit::python
