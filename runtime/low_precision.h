// bfloat16 and float16 as storage types: 16 bits each, never computed in. optjit loads them into f32, computes there
// (torch's "opmath") and rounds once when it stores, so these types only convert: to float exactly, and from float
// to nearest with ties to even (IEEE; float16 keeps its subnormals and overflows to infinity). A double is first
// rounded to float, as torch's c10::BFloat16 and c10::Half constructors do.
#pragma once

#include <bit>
#include <cstdint>

namespace optjit {

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float value) : bits(round_bits(value)) {}
  explicit bfloat16(double value) : bfloat16(static_cast<float>(value)) {}
  explicit operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
  explicit operator double() const { return static_cast<float>(*this); }

  // The upper half of a float's bits, rounded to nearest even; NaNs stay (quiet) NaNs.
  static uint16_t round_bits(float value) {
    const uint32_t u = std::bit_cast<uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      return static_cast<uint16_t>((u >> 16) | 0x0040u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

struct float16 {
  uint16_t bits = 0;

  float16() = default;
  explicit float16(float value) : bits(std::bit_cast<uint16_t>(static_cast<_Float16>(value))) {}
  explicit float16(double value) : float16(static_cast<float>(value)) {}
  explicit operator float() const { return static_cast<float>(std::bit_cast<_Float16>(bits)); }
  explicit operator double() const { return static_cast<float>(*this); }
};

// float8_e4m3fn (torch.float8_e4m3fn): the codes of FP8 optimizer state, converted as c10 converts
// (runtime/block_quantization.h's to_e4m3fn and from_e4m3fn: to nearest even, NaN above 464 in magnitude).
struct float8_e4m3fn {
  uint8_t bits = 0;

  float8_e4m3fn() = default;
  explicit float8_e4m3fn(float value);
  explicit float8_e4m3fn(double value) : float8_e4m3fn(static_cast<float>(value)) {}
  explicit operator float() const;
  explicit operator double() const { return static_cast<float>(*this); }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2 && sizeof(float8_e4m3fn) == 1);

} // namespace optjit
