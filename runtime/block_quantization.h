// Block-wise quantized optimizer state, as torchao 0.18 stores it (torchao/optim: OptimState8bit, OptimState4bit,
// OptimStateFp8) and bitsandbytes before it: values cut into blocks of `block` (256 for 8 bits and FP8, 128 for 4
// bits), each block divided by one f32 scale and kept as codes:
// - 8 bits: one code per value, the index of the nearest entry of a dynamic quantization map (256 f32 values:
//   signed for first moments, unsigned for second moments), the block's scale its absolute maximum;
// - 4 bits: the same with a 16-entry map, two codes per byte (the even element in the high nibble);
// - FP8: one float8_e4m3fn per value, the scale the block's absolute maximum over 448 (e4m3's largest).
// Every step is torchao's own f32 arithmetic in its order (the scale floored at 1e-12, the division, the branchless
// binary search over the map, then rounding up when the residual reaches half the gap), so codes and scales are
// bit-for-bit torchao's (tests/runtime/test_block_quantization.cpp, against values recorded from torchao 0.18). This
// is the reference the compiled kernels' stores are checked against.
#pragma once

#include "runtime/dtype.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace optjit {

enum class BlockFormat : uint8_t { Signed8, Unsigned8, Signed4, Unsigned4, Fp8 };

// torchao's words for them: "signed8", "unsigned8", "signed4", "unsigned4", "fp8".
std::string block_format_name(BlockFormat format);
std::optional<BlockFormat> block_format_from_name(std::string_view name); // none for another word
// The dtype of the format's codes: e4m3 for FP8, u8 for the map indexes (4-bit ones two to a byte).
Dtype block_code_dtype(BlockFormat format);
int block_format_bits(BlockFormat format);             // 8 or 4
int64_t default_block_size(BlockFormat format);        // 256, or 128 for 4 bits (torchao's defaults)
int64_t code_bytes(BlockFormat format, int64_t numel); // numel, or numel / 2 for 4 bits

// The format's dynamic quantization map (torchao's create_dynamic_map, or for unsigned 4 bits linspace(0, 1, 17)
// without its zero): sorted f32 values, 256 or 16 of them. Empty for FP8, whose codes are values.
std::span<const float> quantization_map(BlockFormat format);

// torchao's nearest code of a map, found in one table read instead of a binary search (what the kernels do).
// Its rule (a code c = the last entry <= x, then c + 1 when x - map[c] >= (map[c + 1] - map[c]) * 0.5, each in f32)
// is monotone in x, so the code of x is the number of thresholds <= x: thresholds[i], the least f32 that rounds up
// past entry i (thresholds[size - 1] is NaN: no x reaches past the last). A float's sign, exponent and first
// `mantissa_bits` mantissa bits (its bucket) then bound its code, since no bucket holds two thresholds (checked when
// the tables are made): buckets[bucket(x)] holds the code of the bucket's least value, and the key (x's remaining
// mantissa bits, in x's order: complemented for a negative x) from which its values have the next code; no key
// reaches 1 << key_bits. The exponent is clamped to [min_exponent, 127]: every float under 2^(min_exponent - 126) in
// magnitude has the code of a zero of its sign, and every one of at least 1 that of ±1 (the maps span [-1, 1]), so the
// table holds 2 signs x 24 exponents x 128 buckets (24 KB for the 8-bit maps: the L1 cache keeps it beside the
// streams). NaN has code 0, which a kernel selects itself.
struct CodeSearch {
  static constexpr int mantissa_bits = 7;
  static constexpr int key_bits = 23 - mantissa_bits;
  uint32_t min_exponent = 0;     // the least biased exponent with buckets of its own
  std::vector<float> thresholds; // one per map entry
  // Per bucket (the signs, then the exponents, then the mantissa bits): its least value's code | the key of the next
  // code << 8.
  std::vector<uint32_t> buckets;
  uint32_t exponents() const { return 128 - min_exponent; }
  uint32_t bucket(float x) const;
  static uint32_t key(float x);
  // The code of x (not NaN): the bucket's code, plus one from its key.
  uint8_t code(float x) const;
};
// The tables of a map format (not FP8, whose codes are rounded values).
const CodeSearch& code_search(BlockFormat format);
// The code quantize_blocks gives `x` (already divided by its scale) for a map format: the reference of the tables.
uint8_t nearest_map_code(BlockFormat format, float x);

// float8_e4m3fn (torch.float8_e4m3fn, c10's conversion): to the nearest value, ties to even; above 464 in
// magnitude (and NaN) NaN, as e4m3fn has no infinity.
uint8_t to_e4m3fn(float value);
float from_e4m3fn(uint8_t code);

// Quantizes `values` (numel a multiple of `block`, an even block for 4 bits) into code_bytes() codes and numel /
// block scales. Throws optjit::Error naming the rule a size breaks.
void quantize_blocks(BlockFormat format, std::span<const float> values, int64_t block, uint8_t* codes, float* scales);
// The codes and scale quantize_blocks gives a block whose every value is `value` (a new state entry's starting
// value: Adagrad's initial_accumulator_value, Rprop's lr): the byte each of its codes is (two equal nibbles for 4
// bits), and its scale. 0 gives torchao's new state: zero codes and a zero scale.
struct ConstantBlock {
  uint8_t code_byte = 0;
  float scale = 0;
};
ConstantBlock constant_block(BlockFormat format, int64_t block, float value);
// The values the codes stand for: map entry (or e4m3 value) times its block's scale, in f32 as torchao's dequantize.
void dequantize_blocks(BlockFormat format, const uint8_t* codes, const float* scales, int64_t numel, int64_t block,
                       float* values);

} // namespace optjit
