// runtime/gemm.h: matrix products from the CPU's library (oneDNN), checked against a double-precision sum for
// every transpose, batches, bf16 and f32 operands and results, empty products, several threads at once, and the
// errors for what it does not take.
#include "runtime/error.h"
#include "runtime/gemm.h"
#include "runtime/gemm_reference.h"
#include "runtime/low_precision.h"
#include "skip.h"

#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

using namespace optjit;

using namespace optjit::test;

namespace {

// torch.addmm's alpha and beta over bf16 and f32 operands, a bf16 C read and rounded once, a batch read transposed.
void check_addmm_products() {
  check_product(
      {.m = 24, .n = 24, .k = 24, .operands = Dtype::bf16, .result = Dtype::bf16, .alpha = 2.0315, .beta = -4.775}, 21);
  check_product({.batch = 3,
                 .m = 16,
                 .n = 40,
                 .k = 16,
                 .transpose_b = true,
                 .operands = Dtype::bf16,
                 .result = Dtype::bf16,
                 .beta = 3.4445},
                22);
  check_product({.m = 9, .n = 5, .k = 7, .transpose_a = true, .operands = Dtype::f32, .alpha = -0.5, .beta = 0.25}, 23);
}

} // namespace

TEST_CASE("gemm: f32 and bf16 products equal the exact sum within f32 accumulation, for every transpose") {
  check_every_transpose_and_dtype(run_on_cpu_library);
}

// oneDNN 2.x has bf16 kernels only with AVX512: held to AVX2 (ONEDNN_MAX_CPU_ISA, read when it loads), as on AMD's
// Zen 3, it has none, and every bf16 product is widened to f32 (runtime/gemm_onednn.cpp).
TEST_CASE("gemm: where the CPU has no bf16 kernel (oneDNN held to AVX2) bf16 products are widened to f32, equal to the "
          "exact sum and rounded once") {
  if (dlopen("libdnnl.so.2", RTLD_NOW | RTLD_NOLOAD)) {
    test::skip_test("oneDNN was loaded before this case could hold it to AVX2: run the case alone (ctest does)");
    return;
  }
  setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
  CHECK(Gemm({.m = 4, .n = 4, .k = 4, .operands = Dtype::bf16}).implementation().find("(bf16 widened to f32)") !=
        std::string::npos);
  CHECK(Gemm({.m = 4, .n = 4, .k = 4, .operands = Dtype::f32}).implementation().find("widened") == std::string::npos);
  check_every_transpose_and_dtype(run_on_cpu_library);
  check_addmm_products();
}

TEST_CASE("gemm: a batch multiplies each matrix by its own, and odd and one-wide shapes") {
  check_product({.batch = 3, .m = 5, .n = 7, .k = 3, .transpose_b = true, .operands = Dtype::bf16}, 3);
  check_product(
      {.batch = 4, .m = 64, .n = 64, .k = 96, .transpose_a = true, .operands = Dtype::bf16, .result = Dtype::bf16}, 4);
  check_product({.batch = 1, .m = 1, .n = 300, .k = 1, .operands = Dtype::f32}, 5);
  check_product({.batch = 2, .m = 300, .n = 1, .k = 17, .transpose_a = true, .operands = Dtype::f32}, 6);
}

TEST_CASE("gemm: addmm's alpha and beta, as torch.addmm(C, A, B, beta, alpha), rounded once") {
  check_addmm_products();
  std::vector<float> c = {1, 2, 3, 4};
  Gemm({.m = 2, .n = 2, .k = 0, .operands = Dtype::f32, .beta = 0.5}).run(nullptr, nullptr, c.data());
  CHECK(c == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}); // an empty sum: beta C
}

TEST_CASE("gemm: several threads run one prepared product at once, each getting the same bits") {
  const GemmShape shape{
      .batch = 2, .m = 96, .n = 80, .k = 200, .transpose_b = true, .operands = Dtype::bf16, .result = Dtype::bf16};
  const Gemm gemm(shape);
  const std::vector<bfloat16> a = to_bf16(random_matrices(2 * 96 * 200, 7)),
                              b = to_bf16(random_matrices(2 * 80 * 200, 8));
  std::vector<bfloat16> first(2 * 96 * 80);
  gemm.run(a.data(), b.data(), first.data());
  std::vector<std::vector<bfloat16>> results(4, std::vector<bfloat16>(first.size()));
  std::vector<std::thread> threads;
  for (auto& r : results)
    threads.emplace_back([&gemm, &a, &b, &r] {
      for (int i = 0; i < 5; ++i)
        gemm.run(a.data(), b.data(), r.data());
    });
  for (std::thread& t : threads)
    t.join();
  for (const auto& r : results)
    for (std::size_t e = 0; e < first.size(); ++e)
      REQUIRE(r[e].bits == first[e].bits);
  CHECK(gemm.implementation() != "none");
}

TEST_CASE("gemm: an empty product writes the zeros of an empty sum, or nothing") {
  std::vector<float> c(6, 5.0f);
  Gemm over_nothing({.m = 2, .n = 3, .k = 0, .operands = Dtype::f32});
  over_nothing.run(nullptr, nullptr, c.data());
  CHECK(c == std::vector<float>(6, 0.0f));
  Gemm no_rows({.m = 0, .n = 3, .k = 4, .operands = Dtype::bf16});
  no_rows.run(nullptr, nullptr, nullptr);
  CHECK(no_rows.implementation() == "none");
}

TEST_CASE("gemm: operands other than bf16 or f32, a bf16 result of f32 operands, and negative sizes are refused") {
  CHECK_THROWS_WITH_AS(Gemm({.m = 2, .n = 2, .k = 2, .operands = Dtype::f16}),
                       doctest::Contains("takes bf16 or f32 operands, not f16"), Error);
  CHECK_THROWS_WITH_AS(Gemm({.m = 2, .n = 2, .k = 2, .operands = Dtype::f32, .result = Dtype::bf16}),
                       doctest::Contains("gives f32, or bf16 from bf16 operands, not bf16"), Error);
  CHECK_THROWS_WITH_AS(Gemm({.m = -1, .n = 2, .k = 2}), doctest::Contains("has a negative size"), Error);
}

TEST_CASE("gemm: a library that does not load, or lacks a function, is an optjit::Error naming it") {
  CHECK(gemm_library_available());
  CHECK_THROWS_WITH_AS(probe_gemm_library("/nonexistent/libdnnl.so.2"),
                       doctest::Contains("/nonexistent/libdnnl.so.2 does not load"), Error);
  CHECK_THROWS_WITH_AS(probe_gemm_library("/nonexistent/libdnnl.so.2"), doctest::Contains("apt install libdnnl2"),
                       Error);
  CHECK_THROWS_WITH_AS(probe_gemm_library(OPTJIT_TEST_FAKE_CUDA), doctest::Contains("has no dnnl_engine_create"),
                       Error);
}
