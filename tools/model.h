// Parameters for the CLI's demos and benchmarks: random params with random grads, and the models they use.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace optjit {

// Standard-normal params, each with a standard-normal grad, from `seed`.
std::vector<Tensor> random_params(const std::vector<Shape>& shapes, Dtype dtype, uint64_t seed);
// Fills every grad with fresh standard-normal values (None grads stay None).
void randomize_grads(const std::vector<Tensor>& params, uint64_t seed);
// Deep copies of params (and their grads).
std::vector<Tensor> copy_params(const std::vector<Tensor>& params);

// The 4-param model PyTorch's compiled-optimizer tests use: two Linear(10, 10).
std::vector<Shape> two_linear_shapes();
// A 4-layer MLP (784-1024-1024-512-10): weights and biases, about 2.4M elements.
std::vector<Shape> mlp_shapes();

} // namespace optjit
