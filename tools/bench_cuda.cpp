// optjit bench --device cuda: compiled Adam (f32) on the GPU over the three shapes against the device's
// measured copy bandwidth (a device-to-device copy reads and writes each byte once, as the step does), timed with
// CUDA events in one run; PyTorch's Adam(fused=True) and Adam(foreach=True) on the same shapes beside it when
// python3 with torch is present (tools/bench_torch.py). Then block-quantized state (AdamW with state_dtype, torchao's
// AdamW8bit) against the bound of its own bytes (tools/bench_arrays.h: codes, a scale per block).
#include "compiler/compiled_step.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/options.h"
#include "frontend/optim/registry.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/error.h"
#include "tools/bench_arrays.h"
#include "tools/commands.h"
#include "tools/device_timing.h"
#include "tools/torch_anchors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

namespace optjit {
namespace {

using json = nlohmann::json;

struct Shape2 {
  int64_t count, numel;
  double goal;
};

// `s.count` f32 params of `s.numel` values on the GPU, each with a grad.
std::vector<Tensor> cuda_params(int device, const Shape2& s) {
  std::vector<Tensor> params;
  for (int64_t i = 0; i < s.count; ++i) {
    Tensor p = Tensor::full({s.numel}, 1.0, Dtype::f32).to(Device::cuda(device));
    p.set_grad(Tensor::full({s.numel}, 1e-3, Dtype::f32).to(Device::cuda(device)));
    params.push_back(p);
  }
  return params;
}

// The median time of `step` after three warm-up steps (the first compiles), by CUDA events.
double step_ms(int device, CompiledStep& step) {
  for (int i = 0; i < 3; ++i)
    step();
  return device_median_ms(device, 7, 20, [&] { step(); });
}

json bench_adam(int device, const Shape2& s, double bandwidth, bool graphs) {
  AdamOptions options;
  options.lr = 1e-3;
  Adam opt(cuda_params(device, s), options);
  CompileOptions compile_options;
  compile_options.cuda_graphs = graphs;
  CompiledStep step = compile(opt, compile_options);
  const double ms = step_ms(device, step);
  const double elements = static_cast<double>(s.count * s.numel);
  const double bound_ms = 28.0 * elements / bandwidth * 1e3;
  return {{"optimizer", "Adam"},
          {"shape", std::to_string(s.count) + "x" + std::to_string(s.numel)},
          {"graphs", graphs},
          {"ms", ms},
          {"bound_ms", bound_ms},
          {"ratio", ms / bound_ms},
          {"goal", s.goal},
          {"GB/s", 28.0 * elements / (ms * 1e-3) / 1e9},
          {"compiles", step.metrics().compiles},
          {"dispatch_us", step.metrics().dispatch_ms * 1e3 / static_cast<double>(step.metrics().steps)}};
}

// Optimizer `name` with `options` over `s` on the GPU, compiled, against the bound of its own bytes: each array its
// kernels touch, at its width (tools/bench_arrays.h: codes a byte or a nibble, a scale per block), as the CPU
// bench's traffic probe counts them.
json bench_quantized(int device, const std::string& name, const KeywordOptions& options, const std::string& config,
                     const Shape2& s, double bandwidth) {
  std::unique_ptr<Optimizer> opt = make_optimizer(name, {ParamGroupSpec{cuda_params(device, s), {}}}, options);
  CompiledStep step = compile(*opt);
  const double ms = step_ms(device, step);
  double bytes = 0;
  for (const TrafficProbe::Array& a : arrays_of(*opt, opt->make_buckets().front()))
    bytes += static_cast<double>(a.traffic(s.numel) * s.count);
  const double per_element = bytes / static_cast<double>(s.count * s.numel);
  const double bound_ms = bytes / bandwidth * 1e3;
  return {{"optimizer", name},
          {"options", config},
          {"shape", std::to_string(s.count) + "x" + std::to_string(s.numel)},
          {"bytes_per_element", per_element},
          {"ms", ms},
          {"bound_ms", bound_ms},
          {"ratio", ms / bound_ms},
          {"goal", s.goal},
          {"GB/s", bytes / (ms * 1e-3) / 1e9}};
}

std::vector<json> bench_lowbit(int device, double bandwidth) {
  const Shape2 shape{1000, 100'000, 0};
  std::vector<json> rows;
  for (const char* dtype : {"int8", "int4", "fp8"})
    rows.push_back(bench_quantized(device, "adamw", {{"state_dtype", {named_option_value("state_dtype", dtype)}}},
                                   std::string("state_dtype=") + dtype, shape, bandwidth));
  rows.push_back(bench_quantized(device, "AdamW8bit", {}, "default", shape, bandwidth));
  return rows;
}

} // namespace

int run_bench_cuda(const BenchOptions& options) {
  const int device = options.device.index;
  const cuda::DeviceProperties& props = cuda::properties(device);
  const double bandwidth = device_copy_bandwidth(device);
  const std::vector<Shape2> shapes = {{1, 100'000'000, 1.10}, {1000, 100'000, 1.10}, {10000, 1000, 1.5}};
  json rows = json::array();
  for (bool graphs : {false, true})
    for (const Shape2& s : shapes)
      rows.push_back(bench_adam(device, s, bandwidth, graphs));
  const std::vector<json> lowbit = bench_lowbit(device, bandwidth);
  json torch = torch_anchors("--device cuda");
  if (options.json) {
    for (const json& row : lowbit)
      rows.push_back(row);
    std::printf(
        "%s\n",
        json{{"device", props.name}, {"copy_GBps", bandwidth / 1e9}, {"rows", rows}, {"torch", torch}}.dump(1).c_str());
    return 0;
  }
  std::printf("optjit bench --device cuda:%d: compiled Adam (f32) on %s (sm_%d%d), CUDA events, medians\n"
              "bound = 28 B x elements / measured device copy bandwidth %.0f GB/s\n\n",
              device, props.name.c_str(), props.major, props.minor, bandwidth / 1e9);
  std::printf("%-12s %6s %9s %9s %7s %6s %8s %12s %14s\n", "shape", "graph", "ms", "bound ms", "ratio", "goal", "GB/s",
              "torch fused", "torch foreach");
  for (const json& r : rows) {
    const std::string shape = r["shape"];
    std::string fused = "-", foreach = "-";
    if (torch.contains(shape)) {
      fused = std::to_string(torch[shape]["fused_ms"].get<double>()).substr(0, 7) + " ms";
      foreach
        = std::to_string(torch[shape]["foreach_ms"].get<double>()).substr(0, 7) + " ms";
    }
    std::printf("%-12s %6s %9.4f %9.4f %7.2f %6.2f %8.0f %12s %14s\n", shape.c_str(),
                r["graphs"].get<bool>() ? "yes" : "no", r["ms"].get<double>(), r["bound_ms"].get<double>(),
                r["ratio"].get<double>(), r["goal"].get<double>(), r["GB/s"].get<double>(), fused.c_str(),
                foreach.c_str());
  }
  if (torch.contains("skipped"))
    std::printf("\ntorch anchors skipped: %s\n", torch["skipped"].get<std::string>().c_str());
  std::printf("\nblock-quantized state: bound = its own bytes per element (codes, a scale per block) / the copy "
              "bandwidth\n%-10s %-20s %-12s %6s %9s %9s %7s %8s\n",
              "optimizer", "options", "shape", "B/el", "ms", "bound ms", "ratio", "GB/s");
  for (const json& r : lowbit)
    std::printf("%-10s %-20s %-12s %6.2f %9.4f %9.4f %7.2f %8.0f\n", r["optimizer"].get<std::string>().c_str(),
                r["options"].get<std::string>().c_str(), r["shape"].get<std::string>().c_str(),
                r["bytes_per_element"].get<double>(), r["ms"].get<double>(), r["bound_ms"].get<double>(),
                r["ratio"].get<double>(), r["GB/s"].get<double>());
  return 0;
}

} // namespace optjit
