// Tensors past 32-bit element indexes, stepped by the CPU kernels.
#include "helpers.h"

#include <doctest/doctest.h>

using namespace optjit;

TEST_CASE("low precision: a bf16 tensor of more than 2^31 elements steps with 64-bit indexing") {
  // torch's test_foreach_large_tensor uses 2^32 f16 elements; 2^31 + 64 bf16 ones (8 GiB with the grad) fit the
  // 24 GiB machines this suite runs on and cross the 32-bit index boundary all the same.
  constexpr int64_t n = (int64_t{1} << 31) + 64;
  std::vector<Tensor> params = {Tensor::zeros({n}, Dtype::bf16)};
  params[0].set_grad(Tensor::zeros({n}, Dtype::bf16));
  for (int64_t i : {int64_t{0}, (int64_t{1} << 31) - 1, int64_t{1} << 31, n - 1})
    params[0].grad().set_item(i, static_cast<double>(i % 7 + 1));
  auto opt = make_optimizer("sgd", {ParamGroupSpec{params, {}}}, {{"lr", {0.5}}, {"foreach", {1}}});
  CompiledStep step = compile(*opt);
  step();
  for (int64_t i : {int64_t{0}, (int64_t{1} << 31) - 1, int64_t{1} << 31, n - 1}) {
    INFO("element " << i);
    CHECK(params[0].item(i) == -0.5 * static_cast<double>(i % 7 + 1));
  }
  CHECK(params[0].item(n / 2) == 0);
}
