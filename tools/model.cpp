#include "tools/model.h"
#include "runtime/error.h"

#include <random>

namespace optjit {

std::vector<Tensor> random_params(const std::vector<Shape>& shapes, Dtype dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<Tensor> params;
  for (const Shape& shape : shapes) {
    Tensor p = Tensor::empty(shape, dtype);
    const Tensor components = p.real_view(); // a complex param draws its real and imaginary parts
    for (int64_t i = 0; i < components.numel(); ++i)
      components.set_item(i, normal(rng));
    p.set_grad(Tensor::empty(shape, dtype));
    params.push_back(p);
  }
  randomize_grads(params, seed + 1);
  return params;
}

void randomize_grads(const std::vector<Tensor>& params, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (const Tensor& p : params) {
    if (!p.grad().defined())
      continue;
    const Tensor g = p.grad().real_view();
    for (int64_t i = 0; i < g.numel(); ++i)
      g.set_item(i, normal(rng));
  }
}

std::vector<Tensor> copy_params(const std::vector<Tensor>& params) {
  std::vector<Tensor> copies;
  for (const Tensor& p : params) {
    Tensor c = p.clone();
    if (p.grad().defined())
      c.set_grad(p.grad().clone());
    copies.push_back(c);
  }
  return copies;
}

std::vector<Shape> two_linear_shapes() { return {{10, 10}, {10}, {10, 10}, {10}}; }

std::vector<Shape> mlp_shapes() {
  return {{1024, 784}, {1024}, {1024, 1024}, {1024}, {512, 1024}, {512}, {10, 512}, {10}};
}

} // namespace optjit
