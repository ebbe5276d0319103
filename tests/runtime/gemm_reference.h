// A reference for matrix products (runtime/gemm.h's GemmShape): random operands exact in bf16, the exact sum in
// doubles, and the check of a library's result against it, within f32 accumulation over k terms plus half a bf16
// ulp for a bf16 result. Shared by the CPU library's tests and cuBLAS's (against tests/runtime/fake_cublas).
#pragma once

#include "runtime/gemm.h"
#include "runtime/low_precision.h"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace optjit::test {

// A batch of rows x cols matrices of values exact in bf16 (so f32 and bf16 operands hold the same numbers).
inline std::vector<float> random_matrices(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& v : values)
    v = static_cast<float>(bfloat16(dist(rng)));
  return values;
}

inline std::vector<bfloat16> to_bf16(const std::vector<float>& values) {
  std::vector<bfloat16> out;
  for (float v : values)
    out.emplace_back(v);
  return out;
}

// Element (i, j) of op(X) for a row-major stored matrix of `rows` x `cols` (read transposed when `t`).
inline float at(const float* x, int64_t rows, int64_t cols, bool t, int64_t i, int64_t j) {
  (void)rows;
  return t ? x[j * cols + i] : x[i * cols + j];
}

struct Reference {
  std::vector<double> value, magnitude; // the exact sum, and the sum of |a||b| that bounds its rounding
};

inline Reference reference_product(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) {
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

// A library's product of `shape` on host buffers: C = beta C + alpha op(A) op(B).
using RunProduct = std::function<void(const GemmShape& shape, const void* a, const void* b, void* c)>;

inline void run_on_cpu_library(const GemmShape& shape, const void* a, const void* b, void* c) {
  Gemm(shape).run(a, b, c);
}

// Runs `shape` on random operands through `run` and checks every element against the exact sum: within f32
// accumulation over k terms, plus half a bf16 ulp when the result is bf16.
inline void check_product(const GemmShape& shape, uint32_t seed, const RunProduct& run = run_on_cpu_library) {
  CAPTURE(shape.to_string());
  const std::vector<float> a = random_matrices(shape.batch * shape.m * shape.k, seed);
  const std::vector<float> b = random_matrices(shape.batch * shape.k * shape.n, seed + 1);
  const std::size_t count = static_cast<std::size_t>(shape.batch * shape.m * shape.n);
  // C holds addmm's input when beta is not 0 (values exact in bf16), and garbage otherwise: it must not be read.
  std::vector<float> c =
      shape.beta != 0 ? random_matrices(static_cast<int64_t>(count), seed + 2) : std::vector<float>(count, 1e30f);
  const std::vector<float> c_before = c;
  std::vector<bfloat16> c16 = to_bf16(c);
  if (shape.operands == Dtype::bf16) {
    const std::vector<bfloat16> a16 = to_bf16(a), b16 = to_bf16(b);
    run(shape, a16.data(), b16.data(), shape.result == Dtype::bf16 ? static_cast<void*>(c16.data()) : c.data());
  } else {
    run(shape, a.data(), b.data(), c.data());
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

// check_product on a 37x19x130 product for each of the four transposes and each dtype pair a library takes (bf16
// or f32 operands; an f32 result, or bf16 of bf16).
inline void check_every_transpose_and_dtype(const RunProduct& run) {
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
        check_product(shape, 10 + static_cast<uint32_t>(t), run);
      }
    }
}

} // namespace optjit::test
