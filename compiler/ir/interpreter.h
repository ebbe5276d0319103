// The interpreter: runs a graph op by op over real tensors, materialising every intermediate, like PyTorch's eager
// foreach path. It is the eager backend and the living definition of the IR's meaning.
#pragma once

#include "compiler/ir/arguments.h"
#include "compiler/ir/ir.h"

namespace optjit {

// Evaluates every value, then performs the stores (so loads see the values from before the step).
void interpret(const Graph& graph, const ListArguments& args);

} // namespace optjit
