// optjit bench: compiled steps of every optimizer (f32) against a traffic probe of the same bytes per element,
// cold compile time by param count, and per-step dispatch overhead. The step kernels are memory-bound, so time ÷ probe
// is the figure of merit.
#include "codegen/codegen.h"
#include "compiler/compiled_step.h"
#include "compiler/kernel_cache.h"
#include "compiler/pipeline.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/options.h"
#include "frontend/optim/registry.h"
#include "runtime/thread_pool.h"
#include "tools/bench_arrays.h"
#include "tools/bench_muon.h"
#include "tools/commands.h"
#include "tools/count_configs.h"
#include "tools/timing.h"
#include "tools/torch_anchors.h"
#include "tools/traffic_probe.h"

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>

namespace optjit {
namespace {

using json = nlohmann::json;

// `count` params of `numel` elements each: vectors, or matrices of `rows` rows when rows > 0.
std::vector<Tensor> constant_params(int64_t count, int64_t numel, Dtype dtype = Dtype::f32, int64_t rows = 0) {
  std::vector<Tensor> params;
  const Shape shape = rows > 0 ? Shape{rows, numel / rows} : Shape{numel};
  for (int64_t i = 0; i < count; ++i) {
    Tensor p = Tensor::full(shape, 1.0, dtype);
    p.set_grad(Tensor::full(shape, 1e-3, dtype));
    params.push_back(p);
  }
  return params;
}

struct ShapeCase {
  std::string optimizer; // torch's class name, any case
  KeywordOptions options;
  int64_t count, numel;
  int threads;              // 0: every thread of the pool
  double goal;              // 0: none
  Dtype dtype = Dtype::f32; // of the params and grads
  bool f32_state = false;   // tensor state (and master weights) in f32 whatever the params' dtype
  bool clip = false;        // fused grad-norm clipping (max_norm 1, 2-norm): one more pass that reads the grads
  int64_t rows = 0;         // > 0: matrices of this many rows (Adafactor factors them)
};

// Replaces every param's state with f32 tensors (master weights start as the param's values).
void adopt_f32_state(Optimizer& opt) {
  opt.ensure_state();
  for (int64_t i = 0; i < opt.param_count(); ++i) {
    const Tensor& p = opt.flat_param(i);
    ParamState state;
    for (const StateSpec& spec : opt.new_state_specs(opt.group_of_flat(i))) {
      if (!spec.visible)
        continue;
      const Shape shape = spec.kind == StateKind::Scalar ? Shape{} : p.shape();
      state.emplace_back(spec.name,
                         spec.copies_param ? p.to(Dtype::f32) : Tensor::full(shape, spec.initial, Dtype::f32));
    }
    opt.adopt_state(i, state, Optimizer::StateOrigin::Fresh);
  }
}

// The f32 probe's model of the same arrays: how many are read and how many written.
std::pair<int, int> traffic_of(const std::vector<TrafficProbe::Array>& arrays) {
  int reads = 0, writes = 0;
  for (const TrafficProbe::Array& a : arrays) {
    reads += a.read ? 1 : 0;
    writes += a.written ? 1 : 0;
  }
  return {reads, writes};
}

json bench_shape(const ShapeCase& c) {
  ThreadPool& pool = ThreadPool::global();
  const int threads = c.threads > 0 ? c.threads : pool.size();
  pool.set_active_threads(threads);
  std::vector<Tensor> params = constant_params(c.count, c.numel, c.dtype, c.rows);
  KeywordOptions options = c.options;
  options["foreach"] = {1};
  auto opt = make_optimizer(c.optimizer, {ParamGroupSpec{params, {}}}, options);
  if (c.f32_state)
    adopt_f32_state(*opt);
  if (c.clip)
    opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, false});
  CompiledStep step = compile(*opt);
  const std::vector<int64_t> numels(static_cast<std::size_t>(c.count), c.numel);
  std::vector<TrafficProbe::Array> arrays = arrays_of(*opt, opt->make_buckets().front()); // its one bucket
  if (c.clip) // the bound the issue sets: the update's bytes and one more read of the grads (the norm's pass)
    arrays.push_back({static_cast<int>(dtype_size(c.dtype)), true, false});
  const auto [reads, writes] = traffic_of(arrays);
  // The f32 model covers one pass of an optimizer's usual traffic; anything else (block-quantized state's codes and
  // scales among it) takes the mixed probe.
  const bool mixed = c.dtype != Dtype::f32 || c.f32_state || c.clip || step.kernel_count() > 1 ||
                     std::any_of(arrays.begin(), arrays.end(),
                                 [](const TrafficProbe::Array& a) { return a.bytes != 4 || a.per != 1; });
  TrafficProbe probe = mixed ? TrafficProbe(numels, arrays) : TrafficProbe(numels, reads, writes);
  for (int i = 0; i < 3; ++i) { // compile, create state, fault every page in
    step();
    probe.run();
  }
  // Enough repeats for about a second of each, at least 7.
  const double once = time_ms([&] { step(); });
  const int repeats = std::max(7, std::min(200, static_cast<int>(1000.0 / std::max(once, 1e-3))));
  double ms = 0, probe_ms = 0;
  // Interleaved halves, so drift in the machine's speed hits both sides alike.
  for (int half = 0; half < 2; ++half) {
    ms += median_ms(repeats / 2 + 1, [&] { step(); }) / 2;
    probe_ms += median_ms(repeats / 2 + 1, [&] { probe.run(); }) / 2;
  }
  pool.set_active_threads(pool.size());
  const int64_t elements = c.count * c.numel;
  std::string described = c.options.empty() ? "default" : config_name(c.options);
  if (c.dtype != Dtype::f32 || c.f32_state)
    described += std::string(" ") + std::string(dtype_name(c.dtype)) + (c.f32_state ? "+f32 state" : "");
  if (c.clip)
    described += " +clip";
  if (c.rows > 0)
    described += " (" + std::to_string(c.rows) + "-row matrices)";
  return {{"optimizer", opt->name()},
          {"options", described},
          {"shape", std::to_string(c.count) + "x" + std::to_string(c.numel)},
          {"threads", threads},
          {"bytes_per_element", static_cast<double>(probe.bytes_per_pass()) / static_cast<double>(elements)},
          {"ms", ms},
          {"probe_ms", probe_ms},
          {"gb_per_s", static_cast<double>(probe.bytes_per_pass()) / (ms * 1e6)},
          {"ratio_to_probe", ms / probe_ms},
          {"goal", c.goal}};
}

// torch's clip_grad_norm_(foreach=True) + Adam(fused=True) on the tensors of the clipped row (tools/bench_torch.py,
// the same thread count), beside optjit's fused step; appended to `rows` as metrics.
void print_torch_clip_anchor(const json& row, bool as_json, json& rows) {
  const std::string shape = row["shape"];
  const int threads = row["threads"];
  const json torch = torch_anchors("--cpu-clip " + shape + " --threads " + std::to_string(threads));
  const json times = torch.value(shape, json::object());
  if (!times.contains("clip_fused_ms") || !times.contains("fused_ms")) {
    if (!as_json)
      std::printf("\ntorch beside Adam +clip skipped: %s\n", torch.value("skipped", "no result").c_str());
    return;
  }
  const double clip_fused = times["clip_fused_ms"], fused = times["fused_ms"];
  const double ms = row["ms"];
  if (!as_json)
    std::printf("\ntorch on Adam +clip's tensors (%s, %d threads): clip_grad_norm_(foreach) + Adam(fused) %.3f ms, "
                "Adam(fused) alone %.3f ms; optjit's clipped step %.3f ms, %.2fx torch's\n",
                shape.c_str(), threads, clip_fused, fused, ms, ms / clip_fused);
  rows.push_back({{"metric", "torch_clip_grad_norm_fused_adam_ms"}, {"shape", shape}, {"value", clip_fused}});
  rows.push_back({{"metric", "torch_fused_adam_ms"}, {"shape", shape}, {"value", fused}});
}

void print_row(const json& row) {
  const double goal = row["goal"].get<double>();
  std::printf("%-9s %-30s %-13s %7d %5.4g %9.3f %9.3f %7.1f %7.2f %6s\n", row["optimizer"].get<std::string>().c_str(),
              row["options"].get<std::string>().c_str(), row["shape"].get<std::string>().c_str(),
              row["threads"].get<int>(), row["bytes_per_element"].get<double>(), row["ms"].get<double>(),
              row["probe_ms"].get<double>(), row["gb_per_s"].get<double>(), row["ratio_to_probe"].get<double>(),
              goal > 0 ? fmt::format("{:.2f}", goal).c_str() : "");
}

double cold_compile_ms(int64_t param_count) {
  KernelCache<CpuKernel>::global().clear();
  std::vector<Tensor> params = constant_params(param_count, 16);
  AdamOptions options;
  options.foreach = true;
  Adam adam(params, options);
  CompiledStep step = compile(adam);
  step.kernel_count(); // traces and compiles, runs nothing
  return step.metrics().compile_ms;
}

struct Dispatch {
  double host_us;           // guards, argument checks, binding, hyperparameters
  double step_us;           // the whole step over one element per param: the above plus launch and a trivial kernel
  double new_grads_host_us; // host time when every grad is a new tensor each step (full guard walk and rebind)
};

Dispatch dispatch_us(int64_t param_count) {
  std::vector<Tensor> params = constant_params(param_count, 1);
  AdamOptions options;
  options.foreach = true;
  Adam adam(params, options);
  CompiledStep step = compile(adam);
  for (int i = 0; i < 3; ++i)
    step();
  const StepMetrics before = step.metrics();
  constexpr int kSteps = 200;
  const double step_ms = median_ms(kSteps, [&] { step(); });
  const double host_us = (step.metrics().dispatch_ms - before.dispatch_ms) * 1e3 / kSteps;
  // As after backward() with zero_grad(set_to_none=True): new grad tensors every step, two sets alternating.
  std::vector<Tensor> grads[2];
  for (auto& set : grads)
    for (const Tensor& p : params)
      set.push_back(Tensor::full(p.shape(), 1e-3, Dtype::f32));
  const double dispatch_before = step.metrics().dispatch_ms;
  for (int i = 0; i < kSteps; ++i) {
    for (std::size_t k = 0; k < params.size(); ++k)
      params[k].set_grad(grads[i % 2][k]);
    step();
  }
  return {host_us, step_ms * 1e3, (step.metrics().dispatch_ms - dispatch_before) * 1e3 / kSteps};
}

} // namespace

int run_bench(const BenchOptions& options) {
  // Adam over the three shapes, then every optimizer (and the options that add state) over one.
  std::vector<ShapeCase> cases = {
      {"adam", {}, 1, 50'000'000, 1, 1.10}, {"adam", {}, 1000, 10'000, 0, 1.20}, {"adam", {}, 10000, 100, 0, 2.0}};
  const std::vector<std::pair<std::string, KeywordOptions>> optimizers = {
      {"adam", {{"amsgrad", {1}}}},
      {"adamw", {}},
      {"sgd", {}},
      {"sgd", {{"momentum", {0.9}}}},
      {"nadam", {}},
      {"radam", {}},
      {"adamax", {}},
      {"adagrad", {}},
      {"adadelta", {}},
      {"rmsprop", {}},
      {"rmsprop", {{"centered", {1}}, {"momentum", {0.9}}}},
      {"rprop", {}},
      {"asgd", {}}};
  for (const auto& [name, o] : optimizers)
    cases.push_back({name, o, 1000, 10'000, 0, 0});
  // Low precision against probes of their own bytes: bf16 params and state; bf16 params with f32 state and master
  // weights (reads g16 m32 v32 master32, writes p16 m32 v32 master32: the param itself is never read).
  for (const auto& [count, numel, threads, goal] :
       {std::tuple<int64_t, int64_t, int, double>{1, 50'000'000, 1, 1.10}, {1000, 10'000, 0, 1.20}}) {
    cases.push_back({"adam", {}, count, numel, threads, goal, Dtype::bf16, false});
    cases.push_back({"adam", {{"master_weights", {1}}}, count, numel, threads, goal, Dtype::bf16, true});
  }
  // Adam with fused grad-norm clipping against Adam's bytes plus one more read of the grads (goal 1.25).
  cases.push_back({"adam", {}, 1000, 10'000, 0, 1.25, Dtype::f32, false, true});
  // Adafactor over transformer-shaped matrices (512 x 512, factored: four passes) against a probe of its bytes.
  cases.push_back({"adafactor", {}, 24, 512 * 512, 0, 0, Dtype::f32, false, false, 512});
  // Block-quantized state (the bar: 8-bit AdamW at most 1.15x a probe of its own bytes: param and grad in
  // f32, the codes read and written, a scale per block), as state_dtype and as torchao's class.
  std::vector<ShapeCase> lowbit;
  for (const char* dtype : {"int8", "int4", "fp8"})
    lowbit.push_back({"adamw",
                      {{"state_dtype", {named_option_value("state_dtype", dtype)}}},
                      1000,
                      16384,
                      0,
                      std::string(dtype) == "int8" ? 1.15 : 0});
  lowbit.push_back({"AdamW8bit", {}, 1000, 16384, 0, 1.15});
  if (options.only == "lowbit")
    cases = lowbit;
  else
    cases.insert(cases.end(), lowbit.begin(), lowbit.end());
  json rows = json::array();
  if (options.only != "muon") {
    if (!options.json)
      std::printf("optjit bench: compiled steps (f32, foreach) vs a traffic probe of the same bytes per element "
                  "(medians), %s\n\n%-9s %-30s %-13s %7s %5s %9s %9s %7s %7s %6s\n",
                  host_cpu_description().c_str(), "optimizer", "options", "shape", "threads", "B/el", "ms", "probe ms",
                  "GB/s", "ratio", "goal");
    for (const ShapeCase& c : cases) {
      json row = bench_shape(c);
      if (!options.json)
        print_row(row);
      rows.push_back(std::move(row));
    }
    std::vector<json> clipped; // PyTorch beside the clipped step: clip_grad_norm_ then its fused Adam, same tensors
    for (const json& row : rows)
      if (row.value("options", "").find("+clip") != std::string::npos)
        clipped.push_back(row);
    for (const json& row : clipped)
      print_torch_clip_anchor(row, options.json, rows);
    if (options.only == "lowbit") {
      if (options.json)
        std::printf("%s\n", rows.dump(1).c_str());
      return 0;
    }
    if (!options.json)
      std::printf("\ncold compile (kernel cache cleared), goal < 100 ms and flat in the param count:\n");
    for (int64_t n : {4, 1000, 10000}) {
      const double ms = cold_compile_ms(n);
      if (!options.json)
        std::printf("  %6lld params  %8.2f ms\n", static_cast<long long>(n), ms);
      rows.push_back({{"metric", "compile_ms"}, {"params", n}, {"value", ms}});
    }
    const Dispatch d = dispatch_us(10000);
    if (!options.json)
      std::printf(
          "\ndispatch per step, 10000 params (goal < 20 us):\n"
          "  %8.2f us on the host before launch (guards, argument checks, hyperparameters), grads unchanged\n"
          "  %8.2f us the same with every grad a new tensor each step (every param checked, grad slots repointed)\n"
          "  %8.2f us for a whole step of 1 element per param (dispatch, launch and kernel)\n",
          d.host_us, d.new_grads_host_us, d.step_us);
    rows.push_back({{"metric", "dispatch_us"}, {"params", 10000}, {"value", d.host_us}});
    rows.push_back({{"metric", "dispatch_us_new_grads"}, {"params", 10000}, {"value", d.new_grads_host_us}});
    rows.push_back({{"metric", "step_us_1_element_per_param"}, {"params", 10000}, {"value", d.step_us}});
  }
  if (options.only != "pointwise")
    for (json& row : bench_muon(options.muon_layers, options.json))
      rows.push_back(std::move(row));
  if (options.json)
    std::printf("%s\n", rows.dump(1).c_str());
  return 0;
}

} // namespace optjit
