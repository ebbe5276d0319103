#include "compiler/ir/kernel_plan.h"
#include "compiler/ir/printer.h"

namespace optjit {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i ? ", " : "") + names[i];
  return text.empty() ? "-" : text;
}

} // namespace

std::string print_kernel_plan(const KernelPlan& plan) {
  std::string text = "kernel @" + plan.name + " " + std::string(dtype_name(plan.graph.dtype)) + "\n";
  text += "  tensor slots: " + join(plan.abi.tensor_slots) + "\n";
  text += "  scalar slots: " + join(plan.abi.scalar_slots) + "\n";
  text += "  hypers: " + join(plan.abi.hypers) + "\n";
  std::string scratch;
  for (std::size_t i = 0; i < plan.scratch.size(); ++i)
    scratch += (i ? ", %" : "%") + std::to_string(plan.scratch[i]);
  text += "  scratch: " + (scratch.empty() ? std::string("-") : scratch) + "\n";
  text += "  tensor phase: %0..%" + std::to_string(plan.prologue_size - 1) + ", element phase: %" +
          std::to_string(plan.prologue_size) + "..%" + std::to_string(plan.graph.size() - 1) + "\n";
  return text + print_graph(plan.graph);
}

} // namespace optjit
