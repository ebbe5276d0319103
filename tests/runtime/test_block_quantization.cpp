// runtime/block_quantization.h against torchao 0.18 itself: its four quantization maps, and codes and block scales
// of inputs recorded from its own functions (tests/golden/lowbit/quantization.json, tools/goldens/
// record_lowbit_quantization.py: mixed magnitudes, exact midpoints between codes, zero blocks, values near the
// scale's floor), every bit equal; then e4m3fn's conversion over every code, dequantization, and the size rules.
#include "runtime/block_quantization.h"
#include "runtime/error.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <vector>

using namespace optjit;

namespace {

const nlohmann::json& recorded() {
  static const nlohmann::json data = [] {
    std::ifstream in(std::string(OPTJIT_TEST_GOLDEN_DIR) + "/lowbit/quantization.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return data;
}

std::vector<float> floats(const nlohmann::json& bits) {
  std::vector<float> values;
  for (const auto& b : bits)
    values.push_back(std::bit_cast<float>(b.get<uint32_t>()));
  return values;
}

const std::map<std::string, BlockFormat> kFormats = {{"signed8", BlockFormat::Signed8},
                                                     {"unsigned8", BlockFormat::Unsigned8},
                                                     {"signed4", BlockFormat::Signed4},
                                                     {"unsigned4", BlockFormat::Unsigned4},
                                                     {"fp8", BlockFormat::Fp8}};

} // namespace

TEST_CASE("block quantization: the four quantization maps are torchao's, bit for bit") {
  for (const auto& [name, bits] : recorded()["qmaps"].items()) {
    INFO(name);
    const std::vector<float> expected = floats(bits);
    const std::span<const float> map = quantization_map(kFormats.at(name));
    REQUIRE(map.size() == expected.size());
    for (std::size_t i = 0; i < map.size(); ++i) {
      INFO("entry " << i << ": " << map[i] << " against " << expected[i]);
      CHECK(std::bit_cast<uint32_t>(map[i]) == std::bit_cast<uint32_t>(expected[i]));
    }
  }
}

TEST_CASE("block quantization: codes and scales are torchao's for every format, ties and zero blocks included") {
  int cases = 0;
  for (const auto& c : recorded()["cases"]) {
    const std::string name = c["format"];
    INFO(name);
    const BlockFormat format = kFormats.at(name);
    const int64_t block = c["block"];
    const std::vector<float> input = floats(c["input"]);
    const std::vector<float> expected_scales = floats(c["scale"]);
    const std::vector<uint8_t> expected_codes = c["codes"].get<std::vector<uint8_t>>();
    const auto numel = static_cast<int64_t>(input.size());
    std::vector<uint8_t> codes(static_cast<std::size_t>(code_bytes(format, numel)));
    std::vector<float> scales(static_cast<std::size_t>(numel / block));
    quantize_blocks(format, input, block, codes.data(), scales.data());
    REQUIRE(codes.size() == expected_codes.size());
    REQUIRE(scales.size() == expected_scales.size());
    for (std::size_t b = 0; b < scales.size(); ++b)
      CHECK(std::bit_cast<uint32_t>(scales[b]) == std::bit_cast<uint32_t>(expected_scales[b]));
    int wrong = 0;
    for (std::size_t i = 0; i < codes.size(); ++i)
      if (codes[i] != expected_codes[i] && ++wrong <= 5) {
        INFO("code byte " << i << " (input " << input[i] << ")");
        CHECK(static_cast<int>(codes[i]) == static_cast<int>(expected_codes[i]));
      }
    CHECK(wrong == 0);
    ++cases;
  }
  CHECK(cases == 5);
}

TEST_CASE("block quantization: e4m3fn round trips every code, rounds to nearest even, and has no infinity") {
  for (int code = 0; code < 256; ++code) {
    const float value = from_e4m3fn(static_cast<uint8_t>(code));
    if ((code & 0x7f) == 0x7f) {
      CHECK(std::isnan(value));
      continue;
    }
    CHECK(to_e4m3fn(value) == (code == 0x80 ? 0x80 : code)); // -0 stays -0
  }
  CHECK(from_e4m3fn(0x7e) == 448.0f);
  CHECK(from_e4m3fn(0x01) == std::ldexp(1.0f, -9)); // the smallest subnormal
  CHECK(to_e4m3fn(1.0625f) == to_e4m3fn(1.0f));     // a tie between 1 and 1.125: to the even mantissa
  CHECK(to_e4m3fn(1.1875f) == to_e4m3fn(1.25f));
  CHECK(to_e4m3fn(464.0f) == 0x7e); // the tie with 480 (not a value: NaN's pattern) goes to 448
  CHECK(to_e4m3fn(465.0f) == 0x7f);
  CHECK(to_e4m3fn(-1e30f) == 0xff);
  CHECK(to_e4m3fn(std::ldexp(1.0f, -11)) == 0); // below half the smallest subnormal
}

TEST_CASE("block quantization: dequantized values are the map entry or e4m3 value times the block's scale") {
  for (const auto& [name, format] : kFormats) {
    INFO(name);
    const int64_t block = default_block_size(format), numel = 2 * block;
    std::vector<float> input(static_cast<std::size_t>(numel));
    for (int64_t i = 0; i < numel; ++i)
      input[static_cast<std::size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) * (i < block ? 0.01f : 50.0f);
    if (name.rfind("unsigned", 0) == 0)
      for (float& v : input)
        v = std::fabs(v);
    std::vector<uint8_t> codes(static_cast<std::size_t>(code_bytes(format, numel)));
    std::vector<float> scales(2), back(static_cast<std::size_t>(numel));
    quantize_blocks(format, input, block, codes.data(), scales.data());
    dequantize_blocks(format, codes.data(), scales.data(), numel, block, back.data());
    // Within half the widest gap of the map (or e4m3's relative step) of each block's scale.
    const double gap = format == BlockFormat::Fp8 ? 1.0 / 16 : block_format_bits(format) == 4 ? 0.25 : 0.02;
    for (int64_t i = 0; i < numel; ++i) {
      const double scale = scales[static_cast<std::size_t>(i / block)] * (format == BlockFormat::Fp8 ? 448 : 1);
      CHECK(std::fabs(back[static_cast<std::size_t>(i)] - input[static_cast<std::size_t>(i)]) <= gap * scale);
    }
  }
}

TEST_CASE("block quantization: a count not a multiple of the block, and an odd 4-bit block, are refused by rule") {
  std::vector<float> values(300, 1.0f);
  std::vector<uint8_t> codes(300);
  std::vector<float> scales(3);
  CHECK_THROWS_WITH_AS(quantize_blocks(BlockFormat::Signed8, values, 256, codes.data(), scales.data()),
                       doctest::Contains("300 values in blocks of 256 (signed8 state): the count must be a multiple"),
                       Error);
  CHECK_THROWS_WITH_AS(quantize_blocks(BlockFormat::Unsigned4, values, 3, codes.data(), scales.data()),
                       doctest::Contains("a block size of 3 for 4-bit state"), Error);
  CHECK_THROWS_WITH_AS(quantize_blocks(BlockFormat::Fp8, values, 0, codes.data(), scales.data()),
                       doctest::Contains("blocks hold at least one value"), Error);
}

TEST_CASE(
    "block quantization: the one-table code search finds quantize_blocks' code for every float near a threshold") {
  for (const BlockFormat format :
       {BlockFormat::Signed8, BlockFormat::Unsigned8, BlockFormat::Signed4, BlockFormat::Unsigned4}) {
    CAPTURE(block_format_name(format));
    const CodeSearch& search = code_search(format);
    const std::span<const float> map = quantization_map(format);
    REQUIRE(search.thresholds.size() == map.size());
    REQUIRE(search.buckets.size() == std::size_t{2} * search.exponents() << CodeSearch::mantissa_bits);
    CHECK(search.buckets.size() * sizeof(uint32_t) <= 32768); // an L1 cache holds them
    const auto searched = [&](float x) -> int { return std::isnan(x) ? 0 : search.code(x); };
    std::vector<float> probes = {0.0f,
                                 -0.0f,
                                 1.0f,
                                 -1.0f,
                                 2.0f,
                                 -2.0f,
                                 1e-12f,
                                 -1e-12f,
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN(),
                                 std::numeric_limits<float>::denorm_min()};
    for (std::size_t i = 0; i < map.size(); ++i)
      for (float x : {map[i], search.thresholds[i]})
        for (float y : {x, std::nextafter(x, -2.0f), std::nextafter(x, 2.0f)})
          probes.push_back(y);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uniform(-1.05f, 1.05f);
    for (int k = 0; k < 200000; ++k)
      probes.push_back(uniform(rng) * (k % 3 == 0 ? 1e-4f : 1.0f));
    for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521) // every exponent, subnormals and beyond ±1
      probes.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
    int wrong = 0;
    for (float x : probes)
      if (searched(x) != nearest_map_code(format, x) && ++wrong <= 5)
        CHECK_MESSAGE(false, "x = " << x << " (bits " << std::bit_cast<uint32_t>(x) << "): searched " << searched(x)
                                    << ", torchao's rule " << int(nearest_map_code(format, x)));
    CHECK(wrong == 0);
  }
}
