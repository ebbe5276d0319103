// parse_graph(text): reads the printer's format back into a graph, checking every node through the builder
// (uninterned, so duplicates survive for CSE to find). Errors name the line.
#pragma once

#include "ir/ir.h"

#include <string_view>

namespace optjit {

Graph parse_graph(std::string_view text);

} // namespace optjit
