// Whether tensors share memory, element by element: what a step that reads all of its tensors before it writes any
// (a compiled step) must refuse, where torch's ops, one after the other, would see each other's writes.
#pragma once

#include "runtime/tensor.h"

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace optjit {

// A pair (i, j), i < j, of tensors on one device that hold a byte in common (of the pairs each cluster below finds
// first, the one whose j comes first, so that messages name tensors near the lists' start); nullopt when none do.
// Undefined and empty tensors hold none. Address ranges are sorted, and only tensors whose ranges overlap are compared,
// in one pass over their elements and a bitmap of their common range, so params interleaved in one buffer (every other
// column each) share nothing and cost little. Memory is never read (device tensors are compared by address).
std::optional<std::pair<std::size_t, std::size_t>> first_shared_memory(const std::vector<Tensor>& tensors);

} // namespace optjit
