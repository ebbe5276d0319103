// ListArguments: what one list graph runs on for one step: for every slot the tensor of each list entry (element
// slots hold the tensors, scalar-state slots hold 1-element tensors), and the hyperparameters of each param group.
#pragma once

#include "runtime/tensor.h"

#include <string>
#include <vector>

namespace optjit {

// A tensor of shape [..., m, n] seen as m x n matrices: m and n (1 for a dimension it lacks), its numel, and how many
// matrices it holds (0 when it is empty): what the extent op reads and how rows and columns are counted.
struct Extents {
  int64_t m, n, numel, batches;
};
inline Extents extents_of(const Shape& shape) {
  const int64_t m = shape.size() >= 2 ? shape[shape.size() - 2] : 1, n = shape.empty() ? 1 : shape.back();
  const int64_t numel = shape_numel(shape);
  return {m, n, numel, m * n == 0 ? 0 : numel / (m * n)};
}

struct ListArguments {
  std::vector<std::string> slot_names;
  std::vector<std::vector<Tensor>> slot_tensors; // [slot][tensor]
  std::vector<std::string> hyper_names;
  std::vector<double> hyper;     // [group * hyper_names.size() + k]
  std::vector<int64_t> group_of; // [tensor]: the param group of each list entry
  std::vector<Shape> shapes;     // [tensor]: the shape the kernels walk (the param's); empty: the first slot's

  int64_t n_tensors() const { return static_cast<int64_t>(group_of.size()); }
  // The tensors of slot `name`; throws optjit::Error when the slot is not bound.
  const std::vector<Tensor>& slot(const std::string& name) const;
  int hyper_index(const std::string& name) const; // throws when unknown
  double hyper_value(int64_t tensor, int hyper_index) const {
    return hyper[static_cast<std::size_t>(group_of[static_cast<std::size_t>(tensor)]) * hyper_names.size() +
                 static_cast<std::size_t>(hyper_index)];
  }
};

} // namespace optjit
