// Tensors past 32-bit element indexes, stepped by the CPU kernels.
#include "helpers.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>

using namespace optjit;

namespace {

// The memory the kernel says is available for new allocations (MemAvailable), in bytes; -1 where it does not say.
int64_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1)
      return static_cast<int64_t>(kib) * 1024;
  }
  return -1;
}

} // namespace

TEST_CASE("low precision: a bf16 tensor of more than 2^31 elements steps with 64-bit indexing") {
  // torch's test_foreach_large_tensor uses 2^32 f16 elements; 2^31 + 64 bf16 ones (8 GiB with the grad) fit the
  // 24 GiB machines this suite runs on and cross the 32-bit index boundary all the same.
  constexpr int64_t n = (int64_t{1} << 31) + 64;
  if (const int64_t available = available_memory(); available >= 0 && available < (int64_t{10} << 30)) {
    optjit::test::skip_test("the bf16 param and grad take 8 GiB, and this machine has " +
                            std::to_string(available / (int64_t{1} << 20)) + " MiB available (10 GiB needed)");
    return;
  }
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
