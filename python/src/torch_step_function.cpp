#include "torch_step_function.h"
#include "runtime/error.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <utility>

namespace optjit::python {
namespace {

// Replays `program` into the tracer of a bucket: each instruction's result is a Sym of the list graph.
void replay(const std::vector<StepInstruction>& program, Tracer& t) {
  static const std::map<std::string, Op> binary = {
      {"add", Op::add},         {"sub", Op::sub}, {"mul", Op::mul}, {"div", Op::div}, {"maximum", Op::maximum},
      {"minimum", Op::minimum}, {"pow", Op::pow}, {"lt", Op::lt},   {"gt", Op::gt},   {"eq", Op::eq}};
  static const std::map<std::string, Op> unary = {{"neg", Op::neg},   {"sqrt", Op::sqrt}, {"abs", Op::abs},
                                                  {"sign", Op::sign}, {"exp", Op::exp},   {"log", Op::log}};
  std::vector<Sym> values;
  const auto in = [&](const StepInstruction& i, std::size_t k) {
    OPTJIT_ASSERT(k < i.inputs.size() && i.inputs[k] >= 0 && static_cast<std::size_t>(i.inputs[k]) < values.size(),
                  "step program instruction " + i.op + " reads an undefined value");
    return values[static_cast<std::size_t>(i.inputs[k])];
  };
  for (const StepInstruction& i : program) {
    GraphBuilder& b = t.builder();
    if (i.op == "tensors")
      values.push_back(t.tensors(i.name));
    else if (i.op == "scalar_state")
      values.push_back(t.scalar_state(i.name));
    else if (i.op == "hyper")
      values.push_back(t.hyper(i.name));
    else if (i.op == "constant")
      values.push_back(t.constant(i.number));
    else if (auto op = binary.find(i.op); op != binary.end())
      values.push_back(t.wrap(b.binary(op->second, in(i, 0).id(), in(i, 1).id())));
    else if (auto op1 = unary.find(i.op); op1 != unary.end())
      values.push_back(t.wrap(b.unary(op1->second, in(i, 0).id())));
    else if (i.op == "add_scaled")
      values.push_back(foreach_add(in(i, 0), in(i, 1), in(i, 2)));
    else if (i.op == "lerp")
      values.push_back(foreach_lerp(in(i, 0), in(i, 1), in(i, 2)));
    else if (i.op == "addcmul")
      values.push_back(foreach_addcmul(in(i, 0), in(i, 1), in(i, 2), in(i, 3)));
    else if (i.op == "addcdiv")
      values.push_back(foreach_addcdiv(in(i, 0), in(i, 1), in(i, 2), in(i, 3)));
    else if (i.op == "select")
      values.push_back(where(in(i, 0), in(i, 1), in(i, 2)));
    else if (i.op == "sum")
      values.push_back(sum(in(i, 0)));
    else if (i.op == "row_sum")
      values.push_back(row_sum(in(i, 0)));
    else if (i.op == "col_sum")
      values.push_back(col_sum(in(i, 0)));
    else if (i.op == "extent")
      values.push_back(i.name == "numel" ? t.numel() : t.size(i.name == "n" ? -1 : -2));
    else if (i.op == "max")
      values.push_back(max_of(in(i, 0)));
    else if (i.op == "norm")
      values.push_back(foreach_norm(in(i, 0)));
    else if (i.op == "list_sum")
      values.push_back(list_sum(in(i, 0)));
    else if (i.op == "list_max")
      values.push_back(list_max(in(i, 0)));
    else if (i.op == "store")
      t.store(i.name, in(i, 0));
    else if (i.op == "store_scalar")
      t.store_scalar(i.name, in(i, 0));
    else
      throw Error("step program: unknown instruction '" + i.op + "'");
    if (i.op == "store" || i.op == "store_scalar")
      values.push_back(in(i, 0)); // keeps result numbering one per instruction
  }
}

} // namespace

TorchStepFunction::TorchStepFunction(const std::string& name, std::vector<StepInstruction> program,
                                     const std::vector<std::pair<std::string, nb::list>>& lists,
                                     const std::vector<std::string>& scalar_lists,
                                     const std::vector<std::string>& rows_lists,
                                     const std::vector<std::string>& cols_lists,
                                     const std::map<std::string, double>& hypers, nb::object shard_reducer)
    : shard_reducer_(std::move(shard_reducer)) {
  const auto among = [](const std::vector<std::string>& names, const std::string& slot) {
    return std::find(names.begin(), names.end(), slot) != names.end();
  };
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
    if (slot == "param")
      step_lists.params = std::move(views);
    else if (slot == "grad")
      step_lists.grads = std::move(views);
    else if (among(scalar_lists, slot))
      step_lists.scalars.emplace_back(slot, std::move(views));
    else if (among(rows_lists, slot))
      step_lists.rows.emplace_back(slot, std::move(views));
    else if (among(cols_lists, slot))
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
      name, [program = std::move(program)](Tracer& t) { replay(program, t); }, std::move(step_lists),
      std::move(options)));
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
