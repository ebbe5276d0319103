// bf16 and f16 storage: exact widening, round-to-nearest-even narrowing (ties, NaN, f16 subnormals and overflow),
// tensors of them, and dtype conversion between tensors.
#include "runtime/dtype.h"
#include "runtime/tensor.h"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace optjit;

namespace {

// Round-to-nearest-even to `kept` upper bits of a float's 32, by exhaustive comparison with the two neighbours:
// an independent statement of what bfloat16 rounding must do.
float nearest_even_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const float down = std::bit_cast<float>(u & 0xffff0000u);
  const float up = std::bit_cast<float>((u & 0xffff0000u) + 0x10000u);
  const double d_down = std::fabs(static_cast<double>(x) - down), d_up = std::fabs(static_cast<double>(up) - x);
  if (d_down != d_up)
    return d_down < d_up ? down : up;
  return ((u >> 16) & 1u) == 0 ? down : up;
}

} // namespace

TEST_CASE("low precision: bf16 rounds to nearest even, NaN stays NaN, widening is exact") {
  CHECK(static_cast<float>(bfloat16(1.0f)) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one (1).
  CHECK(static_cast<float>(bfloat16(1.0f + 0x1p-8f)) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: it goes up.
  CHECK(static_cast<float>(bfloat16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  CHECK(static_cast<double>(bfloat16(0.1)) == 0.10009765625); // FORMAT_NEXT: Adagrad's sum starts there
  CHECK(static_cast<double>(bfloat16(0.01)) == 0.010009765625);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::infinity()))));
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (!std::isfinite(x) || std::fabs(x) > 3e38f)
      continue;
    INFO(x);
    CHECK(static_cast<float>(bfloat16(x)) == nearest_even_bf16(x));
  }
}

TEST_CASE("low precision: f16 rounds to nearest even with subnormals and overflow") {
  CHECK(static_cast<float>(float16(1.0f + 0x1p-11f)) == 1.0f);               // a tie, to even
  CHECK(static_cast<float>(float16(1.0f + 3 * 0x1p-11f)) == 1.0f + 0x1p-9f); // a tie, to even (up)
  CHECK(static_cast<float>(float16(0x1p-24f)) == 0x1p-24f);                  // the smallest subnormal
  CHECK(static_cast<float>(float16(0x1p-26f)) == 0.0f);                      // below half of it
  CHECK(static_cast<float>(float16(65504.0f)) == 65504.0f);
  CHECK(std::isinf(static_cast<float>(float16(70000.0f))));
  CHECK(static_cast<double>(float16(1e-8)) == 0.0); // eps = 1e-8 is kept in f32 math, never stored in f16
}

TEST_CASE("low precision: tensors store bf16 and f16, convert between dtypes, and are 2 bytes an element") {
  for (Dtype dtype : {Dtype::bf16, Dtype::f16}) {
    INFO(dtype_name(dtype));
    CHECK(dtype_size(dtype) == 2);
    CHECK(compute_dtype(dtype) == Dtype::f32);
    CHECK(is_low_precision(dtype));
    const std::vector<double> values = {0.1, -2.5, 1e-3, 0.0};
    Tensor t = Tensor::from_values({2, 2}, values, dtype);
    CHECK(t.nbytes() == 8);
    Tensor wide = t.to(Dtype::f32);
    CHECK(wide.dtype() == Dtype::f32);
    for (int64_t i = 0; i < 4; ++i) {
      CHECK(wide.item(i) == t.item(i)); // widening is exact
      CHECK(t.item(i) == round_to_dtype(dtype, values[static_cast<std::size_t>(i)]));
    }
    CHECK(t.item(1) == -2.5);
    Tensor back = wide.to(dtype);
    CHECK(back.to_vector() == t.to_vector());
    CHECK(t.to(dtype).same(t)); // no copy when the dtype is already right
  }
  CHECK(parse_dtype("bfloat16") == Dtype::bf16);
  CHECK(parse_dtype("float16") == Dtype::f16);
  CHECK(dtype_from_safetensors_code("BF16") == Dtype::bf16);
  CHECK(dtype_safetensors_code(Dtype::f16) == "F16");
}
