#include "torch_step_function.h"
#include "runtime/error.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <utility>

namespace optjit::python {

TorchStepFunction::TorchStepFunction(const StepRecording& recording,
                                     const std::vector<std::pair<std::string, nb::list>>& lists,
                                     const std::map<std::string, double>& hypers, nb::object shard_reducer)
    : shard_reducer_(std::move(shard_reducer)) {
  const std::string& name = recording.name();
  StepLists step_lists;
  step_lists.hypers = hypers;
  for (const auto& [slot, tensors] : lists) {
    std::vector<Tensor> views;
    std::size_t k = 0;
    for (nb::handle tensor : tensors) {
      views.push_back(torch_.view(tensor, "tensor " + std::to_string(k++) + " of list '" + slot + "'"));
      if (slot != "grad")
        held_.push_back(nb::borrow(tensor));
    }
    const std::optional<Holds> holds = recording.list_holds(slot);
    if (slot == "param")
      step_lists.params = std::move(views);
    else if (slot == "grad")
      step_lists.grads = std::move(views);
    else if (holds == Holds::Tensor)
      step_lists.scalars.emplace_back(slot, std::move(views));
    else if (holds == Holds::Rows)
      step_lists.rows.emplace_back(slot, std::move(views));
    else if (holds == Holds::Cols)
      step_lists.cols.emplace_back(slot, std::move(views));
    else
      step_lists.state.emplace_back(slot, std::move(views));
  }
  name_ = name;
  lists_ = step_lists;
  CompileOptions options;
  if (!shard_reducer_.is_none())
    options.shard_reducer = [this](std::vector<double>& values, ShardCombine how) {
      nb::gil_scoped_acquire gil; // the step runs without it
      values = nb::cast<std::vector<double>>(shard_reducer_(values, how == ShardCombine::Sum ? "sum" : "max"));
    };
  step_.emplace(compile_step(
      name, [recording](Tracer& t) { recording.replay(t); }, std::move(step_lists), std::move(options)));
}

void TorchStepFunction::set_grads(nb::list grads) {
  const std::vector<Tensor>& params = lists_.params;
  if (static_cast<std::size_t>(nb::len(grads)) != params.size())
    throw Error("step function: " + std::to_string(nb::len(grads)) + " grads for " + std::to_string(params.size()) +
                " params");
  std::vector<Tensor> views;
  for (std::size_t k = 0; k < params.size(); ++k)
    views.push_back(torch_.view(grads[k], "tensor " + std::to_string(k) + " of list 'grad'"));
  // A grad that is a state tensor, or overlaps one, is refused before any change (the lists keep the old grads).
  std::vector<Tensor> old_grads = std::exchange(lists_.grads, views);
  try {
    check_distinct_memory(name_, lists_);
  } catch (...) {
    lists_.grads = std::move(old_grads);
    throw;
  }
  for (std::size_t k = 0; k < params.size(); ++k)
    params[k].set_grad(views[k]);
}

void TorchStepFunction::call(const std::map<std::string, double>& hypers) {
  for (const auto& [key, value] : hypers)
    step_->set_hyper(key, value);
  nb::gil_scoped_release release;
  (*step_)();
}

} // namespace optjit::python
