// optjit._optjit: the C++ side of the Python package (nanobind). optjit::Error becomes optjit.Error; everything
// else is python/optjit/.
#include "cuda_streams.h"
#include "frontend/optim/options.h"
#include "frontend/optim/state_dtype.h"
#include "runtime/error.h"
#include "step_recording_binding.h"
#include "torch_step.h"
#include "torch_step_function.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using optjit::python::CudaStreams;
using optjit::python::TorchStep;
using optjit::python::TorchStepFunction;

NB_MODULE(_optjit, m) {
  m.doc() = "optjit's compiled optimizer steps (the C++ side of the optjit package)";
  nb::exception<optjit::Error>(m, "Error", PyExc_RuntimeError);
  m.attr("OPTION_NONE") = optjit::kOptionNone;                  // an option torch gives as None (Adafactor's eps1)
  m.attr("MIN_QUANTIZED_VALUES") = optjit::kMinQuantizedValues; // torchao's size rule for quantized state

  nb::class_<CudaStreams>(m, "CudaStreams")
      .def(nb::init<std::vector<std::pair<int, uintptr_t>>>(), nb::arg("streams"))
      .def("__enter__", &CudaStreams::enter)
      .def("__exit__", [](CudaStreams& self, nb::args) { self.exit(); });

  nb::class_<TorchStep>(m, "TorchStep")
      .def(nb::init<const std::string&, nb::list, const optjit::python::Keywords&,
                    const std::vector<optjit::python::Keywords>&, nb::handle>(),
           nb::arg("name"), nb::arg("param_groups"), nb::arg("defaults"), nb::arg("group_options"),
           nb::arg("scalar_dtype"))
      .def("binds", &TorchStep::binds, nb::arg("param_groups"))
      .def("sync", &TorchStep::sync, nb::arg("param_groups"), nb::arg("none_values").none() = nb::none())
      .def("set_grad_clipping", &TorchStep::set_grad_clipping, nb::arg("max_norm").none(), nb::arg("norm_type"),
           nb::arg("error_if_nonfinite"))
      .def("set_grad_norm_reducer", &TorchStep::set_grad_norm_reducer, nb::arg("reducer").none())
      .def("set_inf_check_reducer", &TorchStep::set_inf_check_reducer, nb::arg("reducer").none())
      .def("total_grad_norm", &TorchStep::total_grad_norm)
      .def("step_grad_norm", &TorchStep::step_grad_norm)
      .def("set_grad_norm_copy", &TorchStep::set_grad_norm_copy, nb::arg("copy").none())
      .def("stochastic_rounding_steps", &TorchStep::stochastic_rounding_steps)
      .def("set_stochastic_rounding_steps", &TorchStep::set_stochastic_rounding_steps, nb::arg("steps"))
      .def("params_without_state", &TorchStep::params_without_state)
      .def("new_state", &TorchStep::new_state, nb::arg("flat"), nb::arg("shard_quantizes").none() = nb::none())
      .def("state_block_size", &TorchStep::state_block_size, nb::arg("flat"))
      .def("adopt", &TorchStep::adopt, nb::arg("flat"), nb::arg("state"), nb::arg("loaded"))
      .def("sync_state", &TorchStep::sync_state, nb::arg("state"))
      .def("params_with_grads", &TorchStep::params_with_grads)
      .def("update", &TorchStep::update)
      .def("step", &TorchStep::step, nb::arg("grad_scale").none(), nb::arg("found_inf").none(),
           nb::arg("check_in_step"), nb::arg("state"), nb::arg("param_groups"), nb::arg("none_values").none())
      .def("kernel_count", &TorchStep::kernel_count)
      .def("library_call_count", &TorchStep::library_call_count)
      .def("metrics", &TorchStep::metrics)
      .def("dump", &TorchStep::dump, nb::arg("stage"), nb::arg("gpu_sm") = 0)
      .def_prop_ro("param_count", &TorchStep::param_count);

  optjit::python::bind_step_recording(m);
  nb::class_<TorchStepFunction>(m, "TorchStepFunction")
      .def(nb::init<const optjit::StepRecording&, const std::vector<std::pair<std::string, nb::list>>&,
                    const std::map<std::string, double>&, nb::object>(),
           nb::arg("recording"), nb::arg("lists"), nb::arg("hypers"), nb::arg("shard_reducer").none())
      .def("__call__", &TorchStepFunction::call, nb::arg("hypers"))
      .def("set_grads", &TorchStepFunction::set_grads, nb::arg("grads"))
      .def("kernel_count", &TorchStepFunction::kernel_count)
      .def("library_call_count", &TorchStepFunction::library_call_count)
      .def("dump", &TorchStepFunction::dump, nb::arg("stage"), nb::arg("gpu_sm") = 0)
      .def("compiles", &TorchStepFunction::compiles);
}
