// Compiled stores to bf16 round exactly as the runtime's bfloat16 does (to nearest, ties to even; NaN stays a quiet
// NaN; subnormals rounded, not flushed; overflow to inf), in vector steps and in the scalar tail. On a CPU with
// AVX512-BF16 the kernels convert with its instruction and branch to the integer rounding for vectors holding a
// subnormal; ctest runs this case again with OPTJIT_NATIVE_BF16=0 for the integer rounding alone.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/pipeline.h"
#include "ir/parser.h"
#include "runtime/dtype.h"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

using namespace optjit;

TEST_CASE("codegen: compiled bf16 stores round as the runtime does, subnormals, ties, NaN and overflow included") {
  MESSAGE("host: " << host_cpu_description());
  const Graph g = parse_graph(R"(graph @narrow f32 {
  slot "param" : param tensor bf16
  slot "grad" : grad tensor f32
  %0 = tensor "grad" : el f32
  store "param" %0
}
)");
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> special = {0.0f,
                                -0.0f,
                                1.0f + 0x1p-8f,
                                1.0f + 3 * 0x1p-8f,
                                0x1p-127f,
                                -0x1p-130f,
                                0x1p-149f,
                                std::numeric_limits<float>::min(),
                                std::numeric_limits<float>::max(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(),
                                std::bit_cast<float>(0x7f800001u),
                                3.3895e38f};
  std::vector<Tensor> params, grads;
  for (int64_t n : {int64_t{1000}, int64_t{37}, int64_t{5}}) { // vector steps and tails
    std::vector<double> values(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < values.size(); ++i) {
      float x = std::bit_cast<float>(bits(rng));
      if (i % 7 == 0) // subnormals among normal lanes
        x = std::bit_cast<float>(bits(rng) & 0x807fffffu);
      if (i < special.size())
        x = special[i];
      values[i] = x;
    }
    grads.push_back(Tensor::from_values({n}, values, Dtype::f32));
    params.push_back(Tensor::zeros({n}, Dtype::bf16));
  }
  ListArguments args;
  args.slot_names = {"param", "grad"};
  args.slot_tensors = {params, grads};
  args.group_of = {0, 0, 0};
  const PipelineResult pipeline = run_pipeline(g);
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  bool hit = false;
  std::unique_ptr<Executable> code = backend_for(cpu).load(pipeline, cpu, CompileOptions{}, hit);
  code->bind(args);
  code->launch();
  for (std::size_t t = 0; t < params.size(); ++t) {
    const auto* stored = static_cast<const uint16_t*>(params[t].data());
    const auto* source = static_cast<const float*>(grads[t].data());
    for (int64_t i = 0; i < params[t].numel(); ++i) {
      const float x = source[i];
      const float got = std::bit_cast<float>(static_cast<uint32_t>(stored[i]) << 16);
      const float want = static_cast<float>(bfloat16(x));
      INFO("tensor " << t << " element " << i << ": " << x << " (bits " << std::bit_cast<uint32_t>(x) << ")");
      if (std::isnan(want)) // the NaN's upper half, made quiet: the same bits on either path
        CHECK(stored[i] == ((std::bit_cast<uint32_t>(x) >> 16) | 0x40));
      else
        CHECK(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want));
    }
  }
}
