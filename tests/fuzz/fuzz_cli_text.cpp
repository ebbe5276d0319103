// Fuzzes the CLI's text arguments as `optjit dump` uses them: three lines, an optimizer name, a --params shape list
// and a --set option list. Accepted text makes the optimizer over those params (when they are small) and steps it
// once; a refused step must leave it bit-identical (fuzz_support.h).
#include "frontend/optim/registry.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_support.h"
#include "tools/cli_text.h"
#include "tools/model.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace {

constexpr int64_t kMaxElements = 1 << 12;
constexpr std::size_t kMaxParams = 8;

std::string next_line(std::string& rest) {
  const std::size_t newline = rest.find('\n');
  std::string line = rest.substr(0, newline);
  rest = newline == std::string::npos ? std::string() : rest.substr(newline + 1);
  return line;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace optjit;
  std::string rest(reinterpret_cast<const char*>(data), size);
  const std::string name = next_line(rest), params_text = next_line(rest), set_text = next_line(rest);
  std::vector<Shape> shapes;
  KeywordOptions options;
  try {
    shapes = parse_shape_list(params_text);
    options = parse_keyword_options(set_text);
  } catch (const Error&) {
    return 0;
  }
  // Whether a shape fits a tensor is Tensor::empty's check (random_params, for every shape); only small params are
  // stepped. Small counts the nonzero extents: an empty param's state need not be empty (Adafactor's row_var of a
  // [.., m, 0] param is [.., m, 1], as torch makes it), so huge extents beside a zero would allocate huge state.
  if (shapes.size() > kMaxParams)
    return 0;
  bool small = true;
  for (const Shape& shape : shapes) {
    int64_t elements = 1, nonzero = 1;
    for (int64_t extent : shape) {
      if (__builtin_mul_overflow(elements, extent, &elements) || elements > kMaxElements)
        elements = kMaxElements + 1;
      if (extent != 0 && (__builtin_mul_overflow(nonzero, extent, &nonzero) || nonzero > kMaxElements))
        nonzero = kMaxElements + 1;
    }
    if (elements > kMaxElements && std::find(shape.begin(), shape.end(), 0) == shape.end())
      return 0; // too large to make
    small = small && nonzero <= kMaxElements;
  }
  std::vector<Tensor> params;
  try {
    params = random_params(shapes, Dtype::f32, 0);
  } catch (const Error&) {
    return 0;
  }
  if (!small)
    return 0;
  options.try_emplace("foreach", std::vector<double>{1});
  std::unique_ptr<Optimizer> opt;
  try {
    opt = make_optimizer(name, {ParamGroupSpec{params, {}}}, options);
  } catch (const Error&) {
    return 0;
  }
  const fuzz::Snapshot before = fuzz::take_snapshot(*opt, params);
  try {
    opt->step();
  } catch (const Error& e) {
    fuzz::require_unchanged(before, *opt, params, "step", e.what());
  }
  return 0;
}
