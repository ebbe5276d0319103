// Stochastic rounding to bf16, counter-based: the random bits of an element are a pure function of a step's counter,
// a stream (one per param and tensor slot) and the element's index, so a run is bit-reproducible, independent of the
// thread count and of how work is split, and the same on every target: the interpreter, the forloop references and
// the CPU and GPU kernels (codegen emits these very operations) draw the same bits.
//
// The generator is SplitMix64's finalizer (a bijective 64-bit mix with full avalanche), keyed in two levels:
// key = mix(counter ^ mix(stream)), bits = mix(key + index * golden ratio); the top 16 bits are used. An f32 value
// is rounded to bf16 by adding those 16 bits below its kept bits and truncating: it rounds up (in magnitude) with
// probability equal to its distance from the bf16 value below, so the rounding is unbiased. NaN stays a (quiet) NaN,
// infinities stay. A finite value above the largest finite bf16 that round-to-nearest keeps finite (less than half
// an ulp above it) rounds to the largest finite, never to infinity: an update of a fraction of an ulp must not turn
// a param into inf (nearest rounding, torch's, saturates there too).
#pragma once

#include <bit>
#include <cstdint>

namespace optjit {

constexpr uint64_t kRoundingGolden = 0x9e3779b97f4a7c15ull;
// The largest finite bf16 (as f32 bits), and the f32 magnitude from which round-to-nearest gives infinity.
constexpr uint32_t kBf16LargestFinite = 0x7f7f0000u, kBf16NearestOverflow = 0x7f7f8000u;

constexpr uint64_t rounding_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// The 16 random bits of element `index` of `stream` at `counter`.
constexpr uint32_t rounding_bits(uint64_t counter, uint64_t stream, uint64_t index) {
  const uint64_t key = rounding_mix(counter ^ rounding_mix(stream));
  return static_cast<uint32_t>(rounding_mix(key + index * kRoundingGolden) >> 48);
}

// `value` rounded to a bf16 value (returned as the float it is exactly) with random bits `bits` (< 2^16).
inline float stochastic_round_bf16(float value, uint32_t bits) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: quiet, as the nearest rounding keeps it
    return std::bit_cast<float>((u | 0x00400000u) & 0xffff0000u);
  if ((u & 0x7fffffffu) == 0x7f800000u)
    return value;
  const uint32_t rounded = (u + bits) & 0xffff0000u;
  if ((rounded & 0x7fffffffu) == 0x7f800000u && (u & 0x7fffffffu) < kBf16NearestOverflow)
    return std::bit_cast<float>((u & 0x80000000u) | kBf16LargestFinite);
  return std::bit_cast<float>(rounded);
}

// A step counter for `seed` and `step`, as the whole number (below 2^53) the kernels receive as a double.
constexpr uint64_t rounding_counter(uint64_t seed, uint64_t step) {
  return rounding_mix(rounding_mix(seed) ^ step) & ((uint64_t{1} << 53) - 1);
}

} // namespace optjit
