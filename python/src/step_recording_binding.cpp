// optjit._optjit.StepRecording and Holds: the C++ step recording (frontend/trace/step_recording.h) as the Python
// recorder (python/optjit/_step_recording.py) calls it, op by op, while a step function runs on symbolic values.
#include "step_recording_binding.h"

#include "frontend/trace/step_recording.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace optjit::python {

void bind_step_recording(nb::module_& m) {
  nb::enum_<Holds>(m, "Holds")
      .value("element", Holds::Element)
      .value("rows", Holds::Rows)
      .value("cols", Holds::Cols)
      .value("matrix", Holds::Matrix)
      .value("tensor", Holds::Tensor);
  nb::class_<StepRecording>(m, "StepRecording")
      .def(nb::init<std::string, int, int>(), nb::arg("name"), nb::arg("length"), nb::arg("min_rank"))
      .def_prop_ro("name", &StepRecording::name)
      .def_prop_ro("length", &StepRecording::length)
      .def_prop_ro("closed", &StepRecording::closed)
      .def("open", &StepRecording::open)
      .def("close", &StepRecording::close)
      .def("check_open", &StepRecording::check_open)
      .def("list", &StepRecording::list, nb::arg("slot"), nb::arg("holds"))
      .def("hyper", &StepRecording::hyper, nb::arg("name"))
      .def("constant", &StepRecording::constant, nb::arg("value"))
      .def("op", &StepRecording::op, nb::arg("name"), nb::arg("operands"))
      .def("pow_number", &StepRecording::pow_number, nb::arg("base"), nb::arg("exponent"))
      .def("clamp", &StepRecording::clamp, nb::arg("x"), nb::arg("min").none(), nb::arg("max").none())
      .def("reduce", &StepRecording::reduce, nb::arg("x"), nb::arg("name"), nb::arg("order").none(),
           nb::arg("dim").none(), nb::arg("dim_text"), nb::arg("keepdim"))
      .def("reduce_stack", &StepRecording::reduce_stack, nb::arg("x"), nb::arg("name"), nb::arg("order") = 2.0)
      .def("norm_of_scalar", &StepRecording::norm_of_scalar, nb::arg("x"), nb::arg("order"))
      .def("size", &StepRecording::size, nb::arg("x"), nb::arg("dim").none(), nb::arg("dim_text"))
      .def("matmul", &StepRecording::matmul, nb::arg("a").none(), nb::arg("b").none())
      .def("addmm", &StepRecording::addmm)
      .def("transpose", &StepRecording::transpose)
      .def("to_bf16", &StepRecording::to_bf16)
      .def("to_list_dtype", &StepRecording::to_list_dtype)
      .def("is_bf16", &StepRecording::is_bf16)
      .def("written", &StepRecording::written, nb::arg("value"), nb::arg("like"), nb::arg("shape"))
      .def("store", &StepRecording::store, nb::arg("slot"), nb::arg("value"))
      .def("holds", &StepRecording::holds, nb::arg("value"))
      .def("describe", &StepRecording::describe, nb::arg("value"))
      .def("reduces", &StepRecording::reduces)
      .def("stored_slots", &StepRecording::stored_slots)
      .def("instructions", &StepRecording::instructions);
}

} // namespace optjit::python
