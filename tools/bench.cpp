// optjit bench: compiled steps of every optimizer (f32) against a traffic probe of the same bytes per element,
// cold compile time by param count, and per-step dispatch overhead. The step kernels are memory-bound, so time ÷ probe
// is the figure of merit.
#include "codegen/codegen.h"
#include "compiler/compiled_step.h"
#include "compiler/kernel_cache.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/registry.h"
#include "runtime/thread_pool.h"
#include "tools/commands.h"
#include "tools/count_configs.h"
#include "tools/timing.h"
#include "tools/traffic_probe.h"

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include <cstdio>
#include <set>
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
  std::string optimizer; // torch's class name, any case
  KeywordOptions options;
  int64_t count, numel;
  int threads; // 0: every thread of the pool
  double goal; // 0: none
};

// The arrays a compiled step reads and writes per element: distinct tensor slots loaded, tensor slots stored.
std::pair<int, int> traffic_of(const Optimizer& opt) {
  std::set<std::string> read;
  int written = 0;
  for (const Optimizer::Bucket& bucket : opt.make_buckets()) {
    const Graph graph = opt.trace_bucket(bucket);
    for (const Node& n : graph.nodes)
      if (n.op == Op::tensor)
        read.insert(n.name);
    for (const Store& s : graph.stores)
      written += s.kind == StoreKind::Tensor ? 1 : 0;
  }
  return {static_cast<int>(read.size()), written};
}

json bench_shape(const ShapeCase& c) {
  ThreadPool& pool = ThreadPool::global();
  const int threads = c.threads > 0 ? c.threads : pool.size();
  pool.set_active_threads(threads);
  std::vector<Tensor> params = constant_params(c.count, c.numel);
  KeywordOptions options = c.options;
  options["foreach"] = {1};
  auto opt = make_optimizer(c.optimizer, {ParamGroupSpec{params, {}}}, options);
  CompiledStep step = compile(*opt);
  const auto [reads, writes] = traffic_of(*opt);
  TrafficProbe probe(std::vector<int64_t>(static_cast<std::size_t>(c.count), c.numel), reads, writes);
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
  return {{"optimizer", opt->name()},
          {"options", c.options.empty() ? "default" : config_name(c.options)},
          {"shape", std::to_string(c.count) + "x" + std::to_string(c.numel)},
          {"threads", threads},
          {"bytes_per_element", probe.bytes_per_pass() / elements},
          {"ms", ms},
          {"probe_ms", probe_ms},
          {"gb_per_s", static_cast<double>(probe.bytes_per_pass()) / (ms * 1e6)},
          {"ratio_to_probe", ms / probe_ms},
          {"goal", c.goal}};
}

void print_row(const json& row) {
  const double goal = row["goal"].get<double>();
  std::printf("%-9s %-22s %-13s %7d %5lld %9.3f %9.3f %7.1f %7.2f %6s\n", row["optimizer"].get<std::string>().c_str(),
              row["options"].get<std::string>().c_str(), row["shape"].get<std::string>().c_str(),
              row["threads"].get<int>(), static_cast<long long>(row["bytes_per_element"].get<int64_t>()),
              row["ms"].get<double>(), row["probe_ms"].get<double>(), row["gb_per_s"].get<double>(),
              row["ratio_to_probe"].get<double>(), goal > 0 ? fmt::format("{:.2f}", goal).c_str() : "");
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
  json rows = json::array();
  if (!options.json)
    std::printf("optjit bench: compiled steps (f32, foreach) vs a traffic probe of the same bytes per element "
                "(medians), %s\n\n%-9s %-22s %-13s %7s %5s %9s %9s %7s %7s %6s\n",
                host_cpu_description().c_str(), "optimizer", "options", "shape", "threads", "B/el", "ms", "probe ms",
                "GB/s", "ratio", "goal");
  for (const ShapeCase& c : cases) {
    json row = bench_shape(c);
    if (!options.json)
      print_row(row);
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
    std::printf(
        "\ndispatch per step, 10000 params (goal < 20 us):\n"
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
