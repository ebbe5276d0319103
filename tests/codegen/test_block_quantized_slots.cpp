// Block-quantized state slots (ir.h's SlotBlocks): the IR's text and rules, and compiled CPU kernels that load and
// store torchao's codes and scales bit for bit as the interpreter does (runtime/block_quantization.h, itself checked
// against torchao): every format, f32 and bf16 params, items cut at several sizes, adversarial values (exact ties
// between codes, NaN, infinities, zero blocks, e4m3's subnormals and its NaN range).
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "helpers.h"
#include "ir/block_slots.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/block_quantization.h"
#include "skip.h"

#include <doctest/doctest.h>
#include <spdlog/fmt/fmt.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

using namespace optjit;

namespace {

constexpr BlockFormat kFormats[] = {BlockFormat::Signed8, BlockFormat::Unsigned8, BlockFormat::Signed4,
                                    BlockFormat::Unsigned4, BlockFormat::Fp8};

// An Adam-like step over two quantized moments: m = b1 m + g, v = b2 v + g g, p -= lr m / (sqrt(v) + eps).
std::string adam_like(Dtype param, const std::string& m, const std::string& v) {
  return fmt::format(R"(graph @q f32 {{
  slot "param" : param tensor {0}
  slot "grad" : grad tensor {0}
  slot "m" : state tensor {1}
  slot "v" : state tensor {2}
  %0 = hyper "lr" : pt f64
  %1 = hyper "beta1" : pt f64
  %2 = hyper "beta2" : pt f64
  %3 = cast %0 : pt f32
  %4 = cast %1 : pt f32
  %5 = cast %2 : pt f32
  %6 = constant 1e-08 : pt f64
  %7 = cast %6 : pt f32
  %8 = tensor "param" : el f32
  %9 = tensor "grad" : el f32
  %10 = tensor "m" : el f32
  %11 = tensor "v" : el f32
  %12 = mul %4, %10 : el f32
  %13 = add %9, %12 : el f32
  %14 = mul %9, %9 : el f32
  %15 = mul %5, %11 : el f32
  %16 = add %14, %15 : el f32
  %17 = sqrt %16 : el f32
  %18 = add %7, %17 : el f32
  %19 = div %13, %18 : el f32
  %20 = mul %3, %19 : el f32
  %21 = sub %8, %20 : el f32
  store "param" %21
  store "m" %13
  store "v" %16
}}
)",
                     dtype_name(param), m, v);
}

// The grad stored as quantized state, and the old state's values stored as the param: a store and a load alone.
std::string copy_through(const std::string& format) {
  return fmt::format(R"(graph @copy f32 {{
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "m" : state tensor {}
  %0 = tensor "grad" : el f32
  %1 = tensor "m" : el f32
  store "param" %1
  store "m" %0
}}
)",
                     format);
}

std::string format_of(BlockFormat format, int64_t block) {
  return block_format_name(format) + "/" + std::to_string(block);
}

// A quantized slot's codes and scales for a param of `shape`, holding `values` quantized.
struct QuantizedTensor {
  Tensor codes, scales;
  QuantizedTensor(BlockFormat format, int64_t block, const Shape& shape, const std::vector<float>& values) {
    const int64_t numel = shape_numel(shape);
    codes = Tensor::zeros(block_format_bits(format) == 4 ? Shape{numel / 2} : shape, block_code_dtype(format));
    scales = Tensor::zeros({numel / block}, Dtype::f32);
    if (numel > 0)
      quantize_blocks(format, values, block, static_cast<uint8_t*>(codes.data()), scales.data_as<float>());
  }
};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* data = static_cast<const uint8_t*>(t.data());
  return {data, data + t.nbytes()};
}

// Every list entry's param, grad, m and v, made from one seed; `arguments` binds them.
struct Lists {
  std::vector<Shape> shapes;
  std::vector<Tensor> param, grad;
  std::vector<QuantizedTensor> m, v;

  Lists(Dtype dtype, BlockFormat m_format, BlockFormat v_format, int64_t block, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    shapes = {{8 * block}, {3, 4 * block}, {block}, {0}, {129 * block}};
    for (const Shape& shape : shapes) {
      const int64_t numel = shape_numel(shape);
      std::vector<double> p(static_cast<std::size_t>(numel)), g(p.size());
      std::vector<float> m0(p.size()), v0(p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        const float decade =
            std::pow(10.0f, static_cast<float>(static_cast<int>(i / static_cast<std::size_t>(block)) % 9 - 6));
        p[i] = normal(rng);
        g[i] = normal(rng) * decade;
        m0[i] = normal(rng) * decade;
        v0[i] = std::fabs(normal(rng)) * decade * decade;
      }
      param.push_back(Tensor::from_values(shape, p, dtype));
      grad.push_back(Tensor::from_values(shape, g, dtype));
      m.emplace_back(m_format, block, shape, m0);
      v.emplace_back(v_format, block, shape, v0);
    }
  }

  ListArguments arguments() const {
    ListArguments args;
    args.slot_names = {"param", "grad", "m", "m.scale", "v", "v.scale"};
    args.slot_tensors.resize(6);
    for (std::size_t t = 0; t < param.size(); ++t) {
      args.slot_tensors[0].push_back(param[t]);
      args.slot_tensors[1].push_back(grad[t]);
      args.slot_tensors[2].push_back(m[t].codes);
      args.slot_tensors[3].push_back(m[t].scales);
      args.slot_tensors[4].push_back(v[t].codes);
      args.slot_tensors[5].push_back(v[t].scales);
      args.group_of.push_back(0);
    }
    args.hyper_names = {"lr", "beta1", "beta2"};
    args.hyper = {0.01, 0.9, 0.999};
    args.shapes = shapes;
    return args;
  }

  std::vector<std::vector<uint8_t>> bytes() const {
    std::vector<std::vector<uint8_t>> all;
    for (std::size_t t = 0; t < param.size(); ++t)
      for (const Tensor* x : {&param[t], &m[t].codes, &m[t].scales, &v[t].codes, &v[t].scales})
        all.push_back(bytes_of(*x));
    return all;
  }
};

std::unique_ptr<Executable> compile_cpu(const Graph& g, int64_t chunk_elements) {
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  CompileOptions options;
  options.launch.chunk_elements = chunk_elements;
  bool hit = false;
  return backend_for(cpu).load(run_pipeline(g), cpu, options, hit);
}

} // namespace

TEST_CASE("block-quantized slots: the IR prints and parses a slot's format and block, and refuses what breaks a rule") {
  const Graph g = parse_graph(adam_like(Dtype::f32, "signed8/256", "unsigned4/128"));
  verify(g);
  CHECK(g.slot("m")->blocks == SlotBlocks{BlockFormat::Signed8, 256});
  CHECK(g.slot("v")->blocks == SlotBlocks{BlockFormat::Unsigned4, 128});
  CHECK(g.slot("m")->dtype == Dtype::f32);
  CHECK(parse_graph(print_graph(g)) == g);
  CHECK(print_graph(g).find("slot \"v\" : state tensor unsigned4/128") != std::string::npos);
  const auto refused = [](const std::string& slot_line, const std::string& words) {
    const std::string text = "graph @g f32 {\n  " + slot_line + "\n}\n";
    test::check_error_contains([&] { (void)parse_graph(text); }, words);
  };
  refused(R"(slot "p" : param tensor signed8/256)", "only state tensors are block-quantized");
  refused(R"(slot "s" : state scalar fp8/256)", "only state tensors are block-quantized");
  refused(R"(slot "m" : state tensor signed4/127)", "blocks are even");
  refused(R"(slot "m" : state tensor signed8/0)", "a block holds 1 to 16384 values");
  refused(R"(slot "m" : state tensor signed8/16385)", "a block holds 1 to 16384 values");
  refused(R"(slot "m" : state tensor int8/256)", "unknown block format 'int8'");
  refused(R"(slot "m" : state tensor signed8/x)", "bad block size 'x'");
  refused(R"(slot "m" : state tensor u8)", "codes are the storage of block-quantized slots");
  refused(R"(slot "m" : state tensor float8_e4m3fn)", "codes are the storage of block-quantized slots");
}

TEST_CASE(
    "block-quantized slots: compiled CPU kernels step torchao's codes and scales bit for bit as the interpreter") {
  for (const Dtype dtype : {Dtype::f32, Dtype::bf16})
    for (const auto& [m_format, v_format, block] :
         {std::tuple{BlockFormat::Signed8, BlockFormat::Unsigned8, int64_t{256}},
          std::tuple{BlockFormat::Signed4, BlockFormat::Unsigned4, int64_t{128}},
          std::tuple{BlockFormat::Fp8, BlockFormat::Fp8, int64_t{256}},
          std::tuple{BlockFormat::Signed8, BlockFormat::Unsigned8, int64_t{36}}, // blocks that are not whole vectors
          std::tuple{BlockFormat::Signed4, BlockFormat::Fp8, int64_t{6}}})
      for (const int64_t chunk : {int64_t{32768}, int64_t{1000}}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(block_format_name(m_format));
        CAPTURE(block_format_name(v_format));
        CAPTURE(block);
        CAPTURE(chunk);
        const Graph g = parse_graph(adam_like(dtype, format_of(m_format, block), format_of(v_format, block)));
        Lists interpreted(dtype, m_format, v_format, block, 7), compiled(dtype, m_format, v_format, block, 7);
        const auto before = compiled.bytes();
        std::unique_ptr<Executable> kernel = compile_cpu(g, chunk);
        kernel->bind(compiled.arguments());
        for (int step = 0; step < 3; ++step) {
          interpret(g, interpreted.arguments());
          kernel->launch();
        }
        CHECK(compiled.bytes() != before);
        CHECK(compiled.bytes() == interpreted.bytes());
      }
}

TEST_CASE("block-quantized slots: a compiled store quantizes exact ties, NaN, infinities and tiny blocks as torchao") {
  const int64_t block = 256;
  for (const BlockFormat format : kFormats) {
    CAPTURE(block_format_name(format));
    const std::span<const float> map = quantization_map(format);
    // Block 0: every midpoint between neighbouring codes (ties go up), and the codes themselves. Block 1: a NaN among
    // values. Block 2: zeros (scale 1e-12). Block 3: an infinity. Block 4: values near 1e-12. Block 5: e4m3's
    // subnormals and the range that rounds to its NaN code, scaled by the block's maximum (448).
    std::vector<float> values(7 * block, 0.0f);
    for (int64_t i = 0; i < block; ++i) {
      const auto k = static_cast<std::size_t>(i) % std::max<std::size_t>(map.size(), 1);
      if (map.empty()) { // e4m3's values and the midpoints between neighbours (ties to the even code), both signs
        const auto code = static_cast<uint8_t>(i / 2 % 126);
        const float low = from_e4m3fn(code), high = from_e4m3fn(static_cast<uint8_t>(code + 1));
        values[i] = (i % 2 == 0 ? low : (low + high) * 0.5f) * (i / 2 >= 126 ? -1.0f : 1.0f);
      } else if (i % 2 == 0 || k + 1 >= map.size())
        values[i] = map[k];
      else
        values[i] = map[k] + (map[k + 1] - map[k]) * 0.5f;
    }
    values[0] = map.empty() ? 448.0f : 1.0f; // the block's maximum: its scale is exactly 1
    for (int64_t i = 0; i < block; ++i) {
      values[block + i] = std::sin(static_cast<float>(i));
      values[3 * block + i] = std::cos(static_cast<float>(i));
      values[4 * block + i] = 1e-13f * static_cast<float>(i % 11) - 3e-13f;
      values[5 * block + i] = static_cast<float>(i) * 1.85f - 10.0f; // to 462, past e4m3's largest (448)
    }
    // Block 6, for map formats: each threshold of the code search and the float just below it, scaled by the block's
    // maximum 1: where the two-table search turns from one code to the next.
    if (!map.empty()) {
      const std::vector<float>& thresholds = code_search(format).thresholds;
      for (int64_t i = 0; i + 1 < block; i += 2) {
        const float t = thresholds[static_cast<std::size_t>(i / 2) % (thresholds.size() - 1)];
        values[6 * block + i] = t;
        values[6 * block + i + 1] = std::nextafter(t, -2.0f);
      }
      values[7 * block - 1] = 1.0f;
    }
    values[block + 77] = std::numeric_limits<float>::quiet_NaN();
    values[3 * block + 5] = -std::numeric_limits<float>::infinity();
    values[5 * block] = 470.0f; // the block's maximum: 470 / (470 / 448) is 448 or just off it
    const Shape shape{static_cast<int64_t>(values.size())};
    const Graph g = parse_graph(copy_through(format_of(format, block)));
    for (const int64_t chunk : {int64_t{32768}, int64_t{256}}) {
      QuantizedTensor expected(format, block, shape, values),
          state(format, block, shape, std::vector<float>(values.size(), 0.5f));
      std::vector<double> wide(values.begin(), values.end());
      const Tensor grad = Tensor::from_values(shape, wide, Dtype::f32), param = Tensor::zeros(shape, Dtype::f32);
      const QuantizedTensor old = state;
      const Tensor old_codes = old.codes.clone(), old_scales = old.scales.clone();
      ListArguments args;
      args.slot_names = {"param", "grad", "m", "m.scale"};
      args.slot_tensors = {{param}, {grad}, {state.codes}, {state.scales}};
      args.group_of = {0};
      args.shapes = {shape};
      std::unique_ptr<Executable> kernel = compile_cpu(g, chunk);
      kernel->bind(args);
      kernel->launch();
      CHECK(bytes_of(state.codes) == bytes_of(expected.codes));
      CHECK(bytes_of(state.scales) == bytes_of(expected.scales));
      // The param got the old state's values, as dequantize_blocks gives them.
      std::vector<float> dequantized(values.size());
      dequantize_blocks(format, static_cast<const uint8_t*>(old_codes.data()), old_scales.data_as<float>(),
                        static_cast<int64_t>(values.size()), block, dequantized.data());
      CHECK(std::memcmp(param.data(), dequantized.data(), dequantized.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("block-quantized slots: every e4m3 code loads as c10's value, NaN codes and -0 included") {
  // The kernels decode FP8 in integer and float operations (no table): each of the 256 codes, times a scale of 2.
  const Graph g = parse_graph(copy_through("fp8/256"));
  const Tensor param = Tensor::zeros({256}, Dtype::f32), grad = Tensor::zeros({256}, Dtype::f32);
  const Tensor codes = Tensor::zeros({256}, Dtype::e4m3), scales = Tensor::full({1}, 2.0, Dtype::f32);
  for (int code = 0; code < 256; ++code)
    static_cast<uint8_t*>(codes.data())[code] = static_cast<uint8_t>(code);
  ListArguments args;
  args.slot_names = {"param", "grad", "m", "m.scale"};
  args.slot_tensors = {{param}, {grad}, {codes}, {scales}};
  args.group_of = {0};
  args.shapes = {{256}};
  std::unique_ptr<Executable> kernel = compile_cpu(g, 32768);
  kernel->bind(args);
  kernel->launch();
  for (int code = 0; code < 256; ++code) {
    CAPTURE(code);
    const float got = param.data_as<float>()[code];
    const float expected = from_e4m3fn(static_cast<uint8_t>(code)) * 2.0f;    // NaN times 2 keeps its bits
    CHECK(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(expected)); // -0 stays -0, NaNs are c10's
    if ((code & 0x7f) == 0x7f)
      CHECK(std::bit_cast<uint32_t>(got) == (0x7ff00000u | static_cast<uint32_t>(code & 0x80) << 24));
  }
}

TEST_CASE("block-quantized slots: codes and scales that do not fit the slot are refused before anything is written") {
  const Graph g = parse_graph(adam_like(Dtype::f32, "signed8/256", "unsigned8/256"));
  std::unique_ptr<Executable> kernel = compile_cpu(g, 32768);
  const auto refused = [&](const std::function<void(ListArguments&)>& spoil, const std::string& words) {
    Lists lists(Dtype::f32, BlockFormat::Signed8, BlockFormat::Unsigned8, 256, 3);
    ListArguments args = lists.arguments();
    spoil(args);
    const auto before = lists.bytes();
    test::check_error_contains([&] { kernel->bind(args); }, words);
    test::check_error_contains([&] { interpret(g, args); }, words);
    CHECK(lists.bytes() == before);
  };
  refused(
      [](ListArguments& a) {
        a.slot_tensors[2][1] = Tensor::zeros({3, 1024}, Dtype::f32);
      },
      "its codes are f32[3, 1024] on cpu, where 3072 contiguous u8 codes are expected");
  refused([](ListArguments& a) { a.slot_tensors[3][0] = Tensor::zeros({7}, Dtype::f32); },
          "its scales are f32[7] on cpu, where 8 contiguous f32 scales (one per block) are expected");
  refused([](ListArguments& a) { a.slot_tensors[5][0] = Tensor::zeros({8}, Dtype::bf16); },
          "signed8/256 state 'v'" /* the format printed is the slot's */);
  refused(
      [](ListArguments& a) {
        a.shapes[2] = {255};
        a.slot_tensors[0][2] = Tensor::zeros({255}, Dtype::f32);
        a.slot_tensors[1][2] = Tensor::zeros({255}, Dtype::f32);
      },
      "its param has 255 elements, not a multiple of the block of 256");
}

TEST_CASE("block-quantized slots: GPU kernels assemble for sm_80 and sm_90, and refuse blocks past a thread's buffer") {
  const char* ptxas = "/usr/local/cuda/bin/ptxas";
  for (const auto& [m, v] : std::vector<std::pair<std::string, std::string>>{
           {"signed8/256", "unsigned8/256"}, {"signed4/128", "unsigned4/128"}, {"fp8/36", "fp8/36"}}) {
    const Graph g = parse_graph(adam_like(Dtype::bf16, m, v));
    for (const KernelPlan& plan : run_pipeline(g).kernels)
      for (int sm : {80, 90}) {
        INFO(m << " " << plan.name << " sm_" << sm);
        const std::string ptx = compile_gpu_kernel(plan, sm).ptx;
        const bool searches = ptx.find("_search_") != std::string::npos; // the code search's tables (global memory)
        CHECK(searches == (m != "fp8/36"));
        if (!std::filesystem::exists(ptxas))
          continue;
        const std::filesystem::path file = test::temp_path("quantized.ptx");
        std::ofstream(file) << ptx;
        const std::string command =
            std::string(ptxas) + " --gpu-name sm_" + std::to_string(sm) + " " + file.string() + " -o /dev/null";
        CHECK(std::system(command.c_str()) == 0);
        std::filesystem::remove(file);
      }
  }
  if (!std::filesystem::exists(ptxas))
    test::skip_test(std::string(ptxas) + " is absent: the PTX was made, not assembled");
  const Graph big = parse_graph(adam_like(Dtype::f32, "signed8/2048", "unsigned8/2048"));
  test::check_error_contains([&] { (void)compile_gpu_kernel(run_pipeline(big).kernels.front(), 90); },
                             "stores 2 entries of state quantized in blocks of 2048 values: a GPU thread buffers its "
                             "block of each in its local memory, up to 2048 values in all");
}

TEST_CASE("block-quantized slots: a kernel's bytes per element count each slot's codes and scales, not the compute "
          "dtype") {
  const auto bytes = [](Dtype param, const std::string& m, const std::string& v) {
    return run_pipeline(parse_graph(adam_like(param, m, v))).stats.bytes_per_element;
  };
  // param and grad read, param written (f32: 12 bytes); each moment's code read and written, its scale read and written
  CHECK(bytes(Dtype::f32, "f32", "f32") == 12 + 16);
  CHECK(bytes(Dtype::f32, "signed8/256", "unsigned8/256") == doctest::Approx(12 + 2 * 2 * (1 + 4.0 / 256)));
  CHECK(bytes(Dtype::f32, "signed4/128", "unsigned4/128") == doctest::Approx(12 + 2 * 2 * (0.5 + 4.0 / 128)));
  CHECK(bytes(Dtype::bf16, "fp8/256", "fp8/256") == doctest::Approx(6 + 2 * 2 * (1 + 4.0 / 256)));
}
