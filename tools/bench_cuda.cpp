// optjit bench --device cuda: compiled Adam (f32) on the GPU over the three shapes against the device's
// measured copy bandwidth (a device-to-device copy reads and writes each byte once, as the step does), timed with
// CUDA events in one run; PyTorch's Adam(fused=True) and Adam(foreach=True) on the same shapes beside it when
// python3 with torch is present (tools/bench_torch.py). Then more steps against the bound of their own bytes
// (tools/bench_arrays.h): fused clipping, GradScaler's in-step check, bf16 with master weights, Adafactor,
// block-quantized state (AdamW with state_dtype, torchao's AdamW8bit).
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
#include <functional>
#include <string>

namespace optjit {
namespace {

using json = nlohmann::json;

struct Shape2 {
  int64_t count, numel;
  double goal;
};

// `count` params of `shape` and `dtype` on the GPU, each with a grad.
std::vector<Tensor> cuda_params(int device, int64_t count, const Shape& shape, Dtype dtype) {
  std::vector<Tensor> params;
  for (int64_t i = 0; i < count; ++i) {
    Tensor p = Tensor::full(shape, 1.0, dtype).to(Device::cuda(device));
    p.set_grad(Tensor::full(shape, 1e-3, dtype).to(Device::cuda(device)));
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
  Adam opt(cuda_params(device, s.count, {s.numel}, Dtype::f32), options);
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

// A row beside Adam's: optimizer `name` with `options` (then `setup`) over `count` params of `shape` on the GPU,
// compiled, against the bound of its own bytes: each array every kernel of the step touches, at its width
// (tools/bench_arrays.h: codes a byte or a nibble, a scale per block, every pass of a plan of several kernels), as
// the CPU bench's traffic probe counts them.
struct OwnBytesRow {
  std::string name;
  KeywordOptions options;
  std::string config;
  int64_t count;
  Shape shape;
  Dtype dtype = Dtype::f32;
  std::function<void(Optimizer&, int device)> setup = {};
};

json bench_own_bytes(int device, const OwnBytesRow& r, double bandwidth) {
  std::unique_ptr<Optimizer> opt =
      make_optimizer(r.name, {ParamGroupSpec{cuda_params(device, r.count, r.shape, r.dtype), {}}}, r.options);
  if (r.setup)
    r.setup(*opt, device);
  CompiledStep step = compile(*opt);
  const double ms = step_ms(device, step);
  int64_t numel = 1;
  for (int64_t d : r.shape)
    numel *= d;
  double bytes = 0;
  for (const TrafficProbe::Array& a : arrays_of(*opt, opt->make_buckets().front()))
    bytes += static_cast<double>(a.traffic(numel) * r.count);
  if (opt->grad_clipping()) // the grad pass: one more read of the grads
    bytes += static_cast<double>(dtype_size(r.dtype) * numel * r.count);
  const double per_element = bytes / static_cast<double>(r.count * numel);
  const double bound_ms = bytes / bandwidth * 1e3;
  return {{"optimizer", r.name},
          {"options", r.config},
          {"shape", std::to_string(r.count) + "x" + shape_to_string(r.shape)},
          {"bytes_per_element", per_element},
          {"kernels", step.kernel_count()},
          {"ms", ms},
          {"bound_ms", bound_ms},
          {"ratio", ms / bound_ms},
          {"GB/s", bytes / (ms * 1e-3) / 1e9}};
}

// The rows beside Adam's: fused clipping (its norm and coefficient on the device), GradScaler's in-step check with
// it, bf16 params with master weights, Adafactor's factored matrices, and block-quantized state.
std::vector<json> bench_more(int device, double bandwidth) {
  const auto clipping = [](Optimizer& opt, int) { opt.set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, false}); };
  const auto scaled_and_clipped = [&](Optimizer& opt, int d) {
    clipping(opt, d);
    opt.set_grad_scaling(Tensor::full({}, 1024.0, Dtype::f32).to(Device::cuda(d)),
                         Tensor::zeros({}, Dtype::f32).to(Device::cuda(d)), Optimizer::GradsAfterStep::Unscaled,
                         Optimizer::InfCheck::InStep);
  };
  const int64_t count = 1000;
  const Shape vector = {100'000};
  std::vector<OwnBytesRow> rows = {
      {"adam", {}, "+clip", count, vector, Dtype::f32, clipping},
      {"adam", {}, "+clip +GradScaler check", count, vector, Dtype::f32, scaled_and_clipped},
      {"adam", {{"master_weights", {1}}}, "bf16 master_weights", count, vector, Dtype::bf16},
      {"adafactor", {}, "default", 24, {1024, 1024}},
      {"adafactor", {}, "default", 72, {256, 768}}};
  for (const char* dtype : {"int8", "int4", "fp8"})
    rows.push_back({"adamw",
                    {{"state_dtype", {named_option_value("state_dtype", dtype)}}},
                    std::string("state_dtype=") + dtype,
                    count,
                    vector});
  rows.push_back({"AdamW8bit", {}, "default", count, vector});
  std::vector<json> measured;
  for (const OwnBytesRow& r : rows)
    measured.push_back(bench_own_bytes(device, r, bandwidth));
  return measured;
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
  const std::vector<json> lowbit = bench_more(device, bandwidth);
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
  std::printf("\nmore steps: bound = their own bytes per element (every array each kernel touches, codes a byte or a "
              "nibble, a scale per block; +clip: one more read of the grads) / the copy bandwidth\n"
              "%-10s %-24s %-16s %6s %7s %9s %9s %7s %8s\n",
              "optimizer", "options", "shape", "B/el", "kernels", "ms", "bound ms", "ratio", "GB/s");
  for (const json& r : lowbit)
    std::printf("%-10s %-24s %-16s %6.2f %7d %9.4f %9.4f %7.2f %8.0f\n", r["optimizer"].get<std::string>().c_str(),
                r["options"].get<std::string>().c_str(), r["shape"].get<std::string>().c_str(),
                r["bytes_per_element"].get<double>(), r["kernels"].get<int>(), r["ms"].get<double>(),
                r["bound_ms"].get<double>(), r["ratio"].get<double>(), r["GB/s"].get<double>());
  return 0;
}

} // namespace optjit
