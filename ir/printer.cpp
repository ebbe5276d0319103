#include "ir/printer.h"

#include <spdlog/fmt/fmt.h>

#include <charconv>
#include <cmath>

namespace optjit {

std::string format_number(double value) {
  if (std::isnan(value))
    return "nan";
  if (std::isinf(value))
    return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, end);
}

std::string_view store_keyword(StoreKind kind) {
  switch (kind) {
  case StoreKind::Tensor:
    return "store";
  case StoreKind::Scalar:
    return "store_scalar";
  case StoreKind::Carry:
    return "store_carry";
  }
  __builtin_unreachable();
}

std::string print_node(const Graph& graph, ValueId id) {
  const Node& n = graph.node(id);
  std::string line = fmt::format("%{} = {}", id, op_name(n.op));
  if (n.op == Op::constant)
    line += fmt::format(" {}", format_number(n.number));
  else if (!n.name.empty())
    line += fmt::format(" \"{}\"", n.name);
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    line += fmt::format("{}%{}", i ? ", " : " ", n.inputs[i]);
  line += n.level == Level::PerTensor ? " : pt " : " : el ";
  line += dtype_name(n.dtype);
  return line;
}

std::string print_graph(const Graph& graph) {
  std::string text = "graph @" + graph.name + " " + std::string(dtype_name(graph.dtype)) + " {\n";
  for (const Slot& s : graph.slots)
    text += fmt::format("  slot \"{}\" : {} {} {}\n", s.name, slot_role_name(s.role), slot_kind_name(s.kind),
                        slot_storage_name(s));
  for (int id = 0; id < graph.size(); ++id)
    text += "  " + print_node(graph, id) + "\n";
  for (const Store& s : graph.stores)
    text += fmt::format("  {} \"{}\" %{}\n", store_keyword(s.kind), s.name, s.value);
  return text + "}\n";
}

} // namespace optjit
