// optjit bench: compiled Adam (f32) against a traffic probe of the same bytes, cold compile time by param count,
// and per-step dispatch overhead. The step kernels are memory-bound, so time ÷ probe is the figure of merit.
#include "codegen/codegen.h"
#include "compiler/kernel_cache.h"
#include "frontend/adam.h"
#include "frontend/compiled_step.h"
#include "runtime/thread_pool.h"
#include "tools/commands.h"
#include "tools/timing.h"
#include "tools/traffic_probe.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace optjit {
namespace {

using json = nlohmann::json;

std::vector<Tensor> constant_params(int64_t count, int64_t numel) {
  std::vector<Tensor> params;
  for (int64_t i = 0; i < count; ++i) {
    Tensor p = Tensor::full({numel}, 1.0, Dtype::f32);
    p.set_grad(Tensor::full({numel}, 1e-3, Dtype::f32));
    params.push_back(p);
  }
  return params;
}

struct ShapeCase {
  int64_t count, numel;
  int threads; // 0: every thread of the pool
  double goal;
};

json bench_shape(const ShapeCase& c) {
  ThreadPool& pool = ThreadPool::global();
  const int threads = c.threads > 0 ? c.threads : pool.size();
  pool.set_active_threads(threads);
  std::vector<Tensor> params = constant_params(c.count, c.numel);
  AdamOptions options;
  options.foreach = true;
  Adam adam(params, options);
  CompiledStep step = compile(adam);
  TrafficProbe probe(std::vector<int64_t>(static_cast<std::size_t>(c.count), c.numel));
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
  return {{"optimizer", "adam"},
          {"shape", std::to_string(c.count) + "x" + std::to_string(c.numel)},
          {"threads", threads},
          {"ms", ms},
          {"probe_ms", probe_ms},
          {"ratio_to_probe", ms / probe_ms},
          {"goal", c.goal}};
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
  const ShapeCase cases[] = {{1, 50'000'000, 1, 1.10}, {1000, 10'000, 0, 1.20}, {10000, 100, 0, 2.0}};
  json rows = json::array();
  if (!options.json)
    std::printf("optjit bench: Adam f32, compiled vs a traffic probe of 28 B/element (medians), %s\n\n",
                host_cpu_description().c_str());
  if (!options.json)
    std::printf("%-14s %7s %10s %10s %8s %6s\n", "shape", "threads", "ms", "probe ms", "ratio", "goal");
  for (const ShapeCase& c : cases) {
    json row = bench_shape(c);
    if (!options.json)
      std::printf("%-14s %7d %10.3f %10.3f %8.2f %6.2f\n", row["shape"].get<std::string>().c_str(),
                  row["threads"].get<int>(), row["ms"].get<double>(), row["probe_ms"].get<double>(),
                  row["ratio_to_probe"].get<double>(), c.goal);
    rows.push_back(std::move(row));
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
    std::printf("\ndispatch per step, 10000 params (goal < 20 us):\n"
                "  %8.2f us on the host before launch (guards, argument checks, hyperparameters), grads unchanged\n"
                "  %8.2f us the same with every grad a new tensor each step (every param checked, grad slots repointed)\n"
                "  %8.2f us for a whole step of 1 element per param (dispatch, launch and kernel)\n",
                d.host_us, d.new_grads_host_us, d.step_us);
  rows.push_back({{"metric", "dispatch_us"}, {"params", 10000}, {"value", d.host_us}});
  rows.push_back({{"metric", "dispatch_us_new_grads"}, {"params", 10000}, {"value", d.new_grads_host_us}});
  rows.push_back({{"metric", "step_us_1_element_per_param"}, {"params", 10000}, {"value", d.step_us}});
  if (options.json)
    std::printf("%s\n", rows.dump(1).c_str());
  return 0;
}

} // namespace optjit
