// verify(graph): throws optjit::Error naming the first node that breaks a rule of the IR (operands defined
// before use, operand counts, levels and dtypes as the builder assigns them, stores well-formed and unique).
#pragma once

#include "ir/ir.h"

namespace optjit {

void verify(const Graph& graph);

} // namespace optjit
