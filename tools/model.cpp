#include "tools/model.h"
#include "runtime/error.h"

#include <charconv>
#include <random>

namespace optjit {

std::vector<Shape> parse_shape_list(const std::string& text) {
  std::vector<Shape> shapes;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    Shape shape;
    if (item != "scalar" && !item.empty()) {
      std::size_t pos = 0;
      while (pos <= item.size()) {
        std::size_t x = item.find('x', pos);
        std::string extent = item.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
        int64_t value = -1;
        auto [end, ec] = std::from_chars(extent.data(), extent.data() + extent.size(), value);
        if (ec != std::errc() || end != extent.data() + extent.size() || value < 0)
          throw Error("bad shape '" + item + "' in '" + text + "': write extents as NxM, e.g. 10x10");
        shape.push_back(value);
        if (x == std::string::npos)
          break;
        pos = x + 1;
      }
    }
    shapes.push_back(shape);
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return shapes;
}

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
