// runtime/gemm.h: matrix products from the CPU's library (oneDNN), checked against a double-precision sum for
// every transpose, batches, bf16 and f32 operands and results, empty products, several threads at once, and the
// errors for what it does not take.
#include "runtime/error.h"
#include "runtime/gemm.h"
#include "runtime/low_precision.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

using namespace optjit;

namespace {

// A batch of rows x cols matrices of values exact in bf16 (so f32 and bf16 operands hold the same numbers).
std::vector<float> random_matrices(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& v : values)
    v = static_cast<float>(bfloat16(dist(rng)));
  return values;
}

std::vector<bfloat16> to_bf16(const std::vector<float>& values) {
  std::vector<bfloat16> out;
  for (float v : values)
    out.emplace_back(v);
  return out;
}

// Element (i, j) of op(X) for a row-major stored matrix of `rows` x `cols` (read transposed when `t`).
float at(const float* x, int64_t rows, int64_t cols, bool t, int64_t i, int64_t j) {
  (void)rows;
  return t ? x[j * cols + i] : x[i * cols + j];
}

struct Reference {
  std::vector<double> value, magnitude; // the exact sum, and the sum of |a||b| that bounds its rounding
};

Reference reference_product(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) {
  Reference r;
  const int64_t a_rows = s.transpose_a ? s.k : s.m, a_cols = s.transpose_a ? s.m : s.k;
  const int64_t b_rows = s.transpose_b ? s.n : s.k, b_cols = s.transpose_b ? s.k : s.n;
  for (int64_t q = 0; q < s.batch; ++q) {
    const float* aq = a.data() + q * s.m * s.k;
    const float* bq = b.data() + q * s.k * s.n;
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0, mag = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double x = at(aq, a_rows, a_cols, s.transpose_a, i, p), y = at(bq, b_rows, b_cols, s.transpose_b, p, j);
          sum += x * y;
          mag += std::fabs(x * y);
        }
        r.value.push_back(s.alpha * sum);
        r.magnitude.push_back(std::fabs(s.alpha) * mag);
      }
  }
  return r;
}

// Runs `shape` on random operands and checks every element against the exact sum: within f32 accumulation over k
// terms, plus half a bf16 ulp when the result is bf16.
void check_product(const GemmShape& shape, uint32_t seed) {
  CAPTURE(shape.to_string());
  const std::vector<float> a = random_matrices(shape.batch * shape.m * shape.k, seed);
  const std::vector<float> b = random_matrices(shape.batch * shape.k * shape.n, seed + 1);
  const Gemm gemm(shape);
  const std::size_t count = static_cast<std::size_t>(shape.batch * shape.m * shape.n);
  // C holds addmm's input when beta is not 0 (values exact in bf16), and garbage otherwise: it must not be read.
  std::vector<float> c =
      shape.beta != 0 ? random_matrices(static_cast<int64_t>(count), seed + 2) : std::vector<float>(count, 1e30f);
  const std::vector<float> c_before = c;
  std::vector<bfloat16> c16 = to_bf16(c);
  if (shape.operands == Dtype::bf16) {
    const std::vector<bfloat16> a16 = to_bf16(a), b16 = to_bf16(b);
    gemm.run(a16.data(), b16.data(), shape.result == Dtype::bf16 ? static_cast<void*>(c16.data()) : c.data());
  } else {
    gemm.run(a.data(), b.data(), c.data());
  }
  if (shape.result == Dtype::bf16)
    for (std::size_t e = 0; e < count; ++e)
      c[e] = static_cast<float>(c16[e]);
  Reference ref = reference_product(shape, a, b);
  REQUIRE(ref.value.size() == count);
  for (std::size_t e = 0; e < count && shape.beta != 0; ++e) {
    ref.value[e] += shape.beta * c_before[e];
    ref.magnitude[e] += std::fabs(shape.beta * c_before[e]);
  }
  for (std::size_t e = 0; e < count; ++e) {
    double bound = static_cast<double>(shape.k + 1) * 0x1p-24 * ref.magnitude[e] + 1e-30;
    if (shape.result == Dtype::bf16)
      bound += 0x1p-8 * std::fabs(ref.value[e]);
    if (std::fabs(c[e] - ref.value[e]) > bound) {
      CAPTURE(e);
      CHECK(static_cast<double>(c[e]) == doctest::Approx(ref.value[e]));
      return;
    }
  }
  CHECK(true); // every element within its bound
}

} // namespace

TEST_CASE("gemm: f32 and bf16 products equal the exact sum within f32 accumulation, for every transpose") {
  for (Dtype operands : {Dtype::f32, Dtype::bf16})
    for (Dtype result : {Dtype::f32, Dtype::bf16}) {
      if (operands == Dtype::f32 && result == Dtype::bf16)
        continue;
      for (int t = 0; t < 4; ++t) {
        GemmShape shape{.batch = 1, .m = 37, .n = 19, .k = 130};
        shape.transpose_a = (t & 1) != 0;
        shape.transpose_b = (t & 2) != 0;
        shape.operands = operands;
        shape.result = result;
        check_product(shape, 10 + static_cast<uint32_t>(t));
      }
    }
}

TEST_CASE("gemm: a batch multiplies each matrix by its own, and odd and one-wide shapes") {
  check_product({.batch = 3, .m = 5, .n = 7, .k = 3, .transpose_b = true, .operands = Dtype::bf16}, 3);
  check_product(
      {.batch = 4, .m = 64, .n = 64, .k = 96, .transpose_a = true, .operands = Dtype::bf16, .result = Dtype::bf16}, 4);
  check_product({.batch = 1, .m = 1, .n = 300, .k = 1, .operands = Dtype::f32}, 5);
  check_product({.batch = 2, .m = 300, .n = 1, .k = 17, .transpose_a = true, .operands = Dtype::f32}, 6);
}

TEST_CASE("gemm: addmm's alpha and beta, as torch.addmm(C, A, B, beta, alpha), rounded once") {
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
