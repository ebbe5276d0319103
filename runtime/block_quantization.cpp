#include "runtime/block_quantization.h"
#include "runtime/error.h"
#include "runtime/low_precision.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace optjit {
namespace {

// torch.linspace(start, end, steps) in f32 as torch's CPU kernel computes it: the step in f32, the first half of
// the points counted up from start, the second half down from end, each in one fused multiply-add (its vectorized
// kernel's; a separate multiply and add differ in the last bit of 12 of the 65 points of the 8-bit map's last decade).
std::vector<float> linspace_f32(float start, float end, int64_t steps) {
  std::vector<float> points(static_cast<std::size_t>(steps));
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i)
    points[static_cast<std::size_t>(i)] = i < halfway ? std::fma(step, static_cast<float>(i), start)
                                                      : std::fma(-step, static_cast<float>(steps - i - 1), end);
  return points;
}

// torchao's create_dynamic_map(signed, max_exponent_bits, total_bits) (after bitsandbytes'): for each decade
// 10^-(max_exponent_bits-1+i)... up to 1, the means of a linspace(0.1, 1) of ever more points, scaled by the
// decade (in f32, as torch multiplies an f32 tensor by a Python number), and their negations when signed; then 0 and
// 1, sorted.
std::vector<float> dynamic_map(bool is_signed, int max_exponent_bits, int total_bits) {
  std::vector<float> data;
  const int non_sign_bits = total_bits - 1;
  for (int i = 0; i < max_exponent_bits; ++i) {
    const int64_t fraction_items = (int64_t{1} << (i + non_sign_bits - max_exponent_bits + (is_signed ? 0 : 1))) + 1;
    const std::vector<float> boundaries = linspace_f32(0.1f, 1.0f, fraction_items);
    const float decade = static_cast<float>(std::pow(10.0, -(max_exponent_bits - 1) + i));
    for (std::size_t k = 0; k + 1 < boundaries.size(); ++k) {
      const float mean = (boundaries[k] + boundaries[k + 1]) / 2.0f;
      data.push_back(decade * mean);
      if (is_signed)
        data.push_back(-(decade * mean));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  OPTJIT_ASSERT(data.size() == std::size_t{1} << total_bits, "a dynamic map of the wrong size");
  std::sort(data.begin(), data.end());
  return data;
}

std::vector<float> unsigned_4bit_map() { // torch.linspace(0, 1, 17)[1:]: sixteenths, exact
  std::vector<float> points = linspace_f32(0.0f, 1.0f, 17);
  return {points.begin() + 1, points.end()};
}

// torchao's quantize_{8,4}bit_with_qmap: a branchless binary search for the last entry <= x, then one up when x is
// at least half way to the next entry (in f32: x - down >= (up - down) * 0.5).
uint8_t nearest_code(float x, std::span<const float> map) {
  const int top = static_cast<int>(map.size()) - 1;
  int code = 0;
  for (int half = static_cast<int>(map.size()) / 2; half >= 1; half /= 2)
    if (x >= map[static_cast<std::size_t>(code + half)])
      code += half;
  const int up = std::min(code + 1, top);
  const float down_value = map[static_cast<std::size_t>(code)], up_value = map[static_cast<std::size_t>(up)];
  return static_cast<uint8_t>(x - down_value >= (up_value - down_value) * 0.5f ? up : code);
}

// A float's place in f32 order as an unsigned integer (negative floats below positive ones, -0 just below +0).
uint32_t ordered(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}
float from_ordered(uint32_t key) { return std::bit_cast<float>((key & 0x80000000u) != 0 ? key & 0x7fffffffu : ~key); }

CodeSearch make_code_search(std::span<const float> map) {
  CodeSearch search;
  const auto size = map.size();
  // Threshold i: the least f32 in [map[i], map[i + 1]] whose rule rounds up past entry i (the rule is monotone there).
  for (std::size_t i = 0; i + 1 < size; ++i) {
    const float half = (map[i + 1] - map[i]) * 0.5f;
    uint32_t low = ordered(map[i]), high = ordered(map[i + 1]); // high rounds up: x - map[i] is the whole gap
    while (low < high) {
      const uint32_t mid = low + (high - low) / 2;
      if (from_ordered(mid) - map[i] >= half)
        high = mid;
      else
        low = mid + 1;
    }
    search.thresholds.push_back(from_ordered(low));
  }
  search.thresholds.push_back(std::numeric_limits<float>::quiet_NaN()); // no x reaches it: the last code is last
  const auto code_of = [&](float x) {
    if (std::isnan(x))
      return std::size_t{0};
    return static_cast<std::size_t>(std::upper_bound(search.thresholds.begin(), search.thresholds.end() - 1, x) -
                                    search.thresholds.begin());
  };
  // The least exponent with buckets of its own: the largest whose floats, and every smaller one, have the code of a
  // zero of their sign (the codes are monotone: its largest float tells).
  search.min_exponent = 0;
  while (search.min_exponent < 127) {
    const float largest = std::bit_cast<float>((search.min_exponent + 1) << 23 | 0x7fffffu);
    if (code_of(largest) != code_of(0.0f) || code_of(-largest) != code_of(-0.0f))
      break;
    ++search.min_exponent;
  }
  search.buckets.resize(std::size_t{2} * search.exponents() << CodeSearch::mantissa_bits);
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t exponent = search.min_exponent; exponent < 128; ++exponent)
      for (uint32_t mantissa = 0; mantissa < (1u << CodeSearch::mantissa_bits); ++mantissa) {
        // The bucket's floats, from its first to its last bits; the least exponent's bucket holds the smaller floats
        // too, whose code is its (the loop above), and the last exponent's the larger, which code as ±1 do.
        const uint32_t first = sign << 31 | exponent << 23 | mantissa << CodeSearch::key_bits;
        const uint32_t last = first | ((1u << CodeSearch::key_bits) - 1);
        const float least = std::bit_cast<float>(sign != 0 ? last : first);
        const float most = std::bit_cast<float>(sign != 0 ? first : last);
        const std::size_t base = code_of(least);
        OPTJIT_ASSERT(code_of(most) <= base + 1, "a bucket of the code search holds two thresholds");
        const uint32_t next =
            code_of(most) == base ? 1u << CodeSearch::key_bits : CodeSearch::key(search.thresholds[base]);
        search.buckets[search.bucket(least)] = static_cast<uint32_t>(base) | next << 8;
      }
  const float one = 1.0f, beyond = std::numeric_limits<float>::max();
  OPTJIT_ASSERT(code_of(beyond) == code_of(one) && code_of(-beyond) == code_of(-one),
                "the code search clamps floats beyond ±1 to ±1's exponent: the map spans more than [-1, 1]");
  return search;
}

void check_sizes(BlockFormat format, int64_t numel, int64_t block) {
  if (block <= 0)
    throw Error(fmt::format("a block size of {} for {} state: blocks hold at least one value", block,
                            block_format_name(format)));
  if (numel % block != 0)
    throw Error(fmt::format("{} values in blocks of {} ({} state): the count must be a multiple of the block size",
                            numel, block, block_format_name(format)));
  if (block_format_bits(format) == 4 && block % 2 != 0)
    throw Error(fmt::format("a block size of {} for 4-bit state: two codes share a byte, so blocks are even", block));
}

} // namespace

std::string block_format_name(BlockFormat format) {
  switch (format) {
  case BlockFormat::Signed8:
    return "signed8";
  case BlockFormat::Unsigned8:
    return "unsigned8";
  case BlockFormat::Signed4:
    return "signed4";
  case BlockFormat::Unsigned4:
    return "unsigned4";
  case BlockFormat::Fp8:
    return "fp8";
  }
  return "?";
}

std::optional<BlockFormat> block_format_from_name(std::string_view name) {
  for (BlockFormat format :
       {BlockFormat::Signed8, BlockFormat::Unsigned8, BlockFormat::Signed4, BlockFormat::Unsigned4, BlockFormat::Fp8})
    if (name == block_format_name(format))
      return format;
  return std::nullopt;
}

Dtype block_code_dtype(BlockFormat format) { return format == BlockFormat::Fp8 ? Dtype::e4m3 : Dtype::u8; }

const CodeSearch& code_search(BlockFormat format) {
  OPTJIT_ASSERT(format != BlockFormat::Fp8, "FP8 codes are rounded values, found without a map");
  static const std::array<CodeSearch, 4> tables = {make_code_search(quantization_map(BlockFormat::Signed8)),
                                                   make_code_search(quantization_map(BlockFormat::Unsigned8)),
                                                   make_code_search(quantization_map(BlockFormat::Signed4)),
                                                   make_code_search(quantization_map(BlockFormat::Unsigned4))};
  return tables[static_cast<std::size_t>(format)];
}

uint32_t CodeSearch::key(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t negative = static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31);
  return (bits ^ negative) & ((1u << key_bits) - 1);
}

uint8_t CodeSearch::code(float x) const {
  const uint32_t entry = buckets[bucket(x)];
  return static_cast<uint8_t>((entry & 0xffu) + (key(x) >= entry >> 8 ? 1u : 0u));
}

uint32_t CodeSearch::bucket(float x) const {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t exponent = std::clamp((bits >> 23) & 0xffu, min_exponent, 127u) - min_exponent;
  const uint32_t mantissa = (bits >> key_bits) & ((1u << mantissa_bits) - 1);
  return ((bits >> 31) * exponents() + exponent) << mantissa_bits | mantissa;
}

uint8_t nearest_map_code(BlockFormat format, float x) { return nearest_code(x, quantization_map(format)); }

int block_format_bits(BlockFormat format) {
  return format == BlockFormat::Signed4 || format == BlockFormat::Unsigned4 ? 4 : 8;
}

int64_t default_block_size(BlockFormat format) { return block_format_bits(format) == 4 ? 128 : 256; }

int64_t code_bytes(BlockFormat format, int64_t numel) { return block_format_bits(format) == 4 ? numel / 2 : numel; }

std::span<const float> quantization_map(BlockFormat format) {
  static const std::vector<float> signed8 = dynamic_map(true, 7, 8), unsigned8 = dynamic_map(false, 7, 8),
                                  signed4 = dynamic_map(true, 3, 4), unsigned4 = unsigned_4bit_map();
  switch (format) {
  case BlockFormat::Signed8:
    return signed8;
  case BlockFormat::Unsigned8:
    return unsigned8;
  case BlockFormat::Signed4:
    return signed4;
  case BlockFormat::Unsigned4:
    return unsigned4;
  case BlockFormat::Fp8:
    return {};
  }
  return {};
}

// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, 0x7f and 0xff are NaN (c10's bits: the sign
// and 0x7ff00000); subnormals step 2^-9.
float from_e4m3fn(uint8_t code) {
  const uint8_t magnitude = code & 0x7f;
  const float sign = (code & 0x80) != 0 ? -1.0f : 1.0f;
  if (magnitude == 0x7f)
    return std::bit_cast<float>(0x7ff00000u | static_cast<uint32_t>(code & 0x80) << 24);
  const int exponent = magnitude >> 3, mantissa = magnitude & 7;
  const float value = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                    : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return sign * value;
}

uint8_t to_e4m3fn(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float magnitude = std::fabs(value);
  if (std::isnan(value) || magnitude > 464.0f) // past the tie between 448 and the NaN pattern's 480
    return sign | 0x7f;
  // The codes 0..126 are ordered as their values: the last whose value is <= magnitude, then the nearer of it and
  // the next, ties to the even code (an even mantissa).
  int low = 0, high = 126;
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (from_e4m3fn(static_cast<uint8_t>(mid)) <= magnitude)
      low = mid;
    else
      high = mid - 1;
  }
  if (low < 126) {
    const float below = from_e4m3fn(static_cast<uint8_t>(low)), above = from_e4m3fn(static_cast<uint8_t>(low + 1));
    const float to_below = magnitude - below, to_above = above - magnitude;
    if (to_above < to_below || (to_above == to_below && (low & 1) != 0))
      ++low;
  }
  return sign | static_cast<uint8_t>(low);
}

void quantize_blocks(BlockFormat format, std::span<const float> values, int64_t block, uint8_t* codes, float* scales) {
  const auto numel = static_cast<int64_t>(values.size());
  check_sizes(format, numel, block);
  const std::span<const float> map = quantization_map(format);
  for (int64_t b = 0; b < numel / block; ++b) {
    const float* x = values.data() + b * block;
    float absmax = 0;
    for (int64_t i = 0; i < block; ++i)
      absmax = std::isnan(x[i]) || std::isnan(absmax) ? std::numeric_limits<float>::quiet_NaN()
                                                      : std::max(absmax, std::fabs(x[i]));
    const float floored = std::isnan(absmax) ? absmax : std::max(absmax, 1e-12f); // clip(1e-12)
    const float scale = format == BlockFormat::Fp8 ? floored / 448.0f : floored;
    scales[b] = scale;
    for (int64_t i = 0; i < block; ++i) {
      const float scaled = x[i] / scale;
      const int64_t at = b * block + i;
      if (format == BlockFormat::Fp8) {
        codes[at] = to_e4m3fn(scaled);
      } else if (block_format_bits(format) == 8) {
        codes[at] = nearest_code(scaled, map);
      } else if (at % 2 == 0) {
        codes[at / 2] = static_cast<uint8_t>(nearest_code(scaled, map) << 4);
      } else {
        codes[at / 2] |= nearest_code(scaled, map);
      }
    }
  }
}

void dequantize_blocks(BlockFormat format, const uint8_t* codes, const float* scales, int64_t numel, int64_t block,
                       float* values) {
  check_sizes(format, numel, block);
  const std::span<const float> map = quantization_map(format);
  for (int64_t at = 0; at < numel; ++at) {
    float value;
    if (format == BlockFormat::Fp8)
      value = from_e4m3fn(codes[at]);
    else if (block_format_bits(format) == 8)
      value = map[codes[at]];
    else
      value = map[at % 2 == 0 ? codes[at / 2] >> 4 : codes[at / 2] & 0xf];
    values[at] = value * scales[at / block];
  }
}

ConstantBlock constant_block(BlockFormat format, int64_t block, float value) {
  if (value == 0)
    return {};
  const std::vector<float> values(static_cast<std::size_t>(block), value);
  std::vector<uint8_t> codes(static_cast<std::size_t>(code_bytes(format, block)));
  ConstantBlock constant;
  quantize_blocks(format, values, block, codes.data(), &constant.scale);
  constant.code_byte = codes[0];
  return constant;
}

float8_e4m3fn::float8_e4m3fn(float value) : bits(to_e4m3fn(value)) {}
float8_e4m3fn::operator float() const { return from_e4m3fn(bits); }

} // namespace optjit
