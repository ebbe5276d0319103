// Deterministic text for graphs: values numbered by position, numbers in shortest round-trip form.
// The format parses back (ir/parser.h): print(parse(print(g))) == print(g).
//
//   graph @adam f32 {
//     slot "grad" : grad tensor f32
//     slot "exp_avg" : state tensor f32
//     slot "step" : state scalar f32
//     %0 = tensor "grad" : el f32
//     %1 = hyper "beta1" : pt f64
//     %2 = cast %1 : pt f32
//     %3 = mul %0, %2 : el f32
//     store "exp_avg" %3
//     store_scalar "step" %5
//     store_carry "c0" %2
//   }
#pragma once

#include "ir/ir.h"

#include <string>

namespace optjit {

std::string print_graph(const Graph& graph);
std::string print_node(const Graph& graph, ValueId id); // one line, without indentation
std::string format_number(double value);                // shortest text that parses back to the same double
std::string_view store_keyword(StoreKind kind);         // "store", "store_scalar", "store_carry"

} // namespace optjit
