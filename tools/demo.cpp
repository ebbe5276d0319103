// optjit demo: what a user cares about when compiling Adam for a real model's parameters.
#include "compiler/compiled_step.h"
#include "frontend/optim/adam.h"
#include "runtime/thread_pool.h"
#include "tools/commands.h"
#include "tools/device_timing.h"
#include "tools/model.h"
#include "tools/timing.h"
#include "tools/traffic_probe.h"

#include <cmath>
#include <cstdio>

namespace optjit {
namespace {

// Largest |a - b| over the params and every state entry of two optimizers over equally shaped params.
double max_difference(const std::vector<Tensor>& a, const Optimizer& oa, const std::vector<Tensor>& b,
                      const Optimizer& ob) {
  double worst = 0;
  auto compare = [&](const Tensor& x, const Tensor& y) {
    std::vector<double> u = x.to_vector(), w = y.to_vector();
    for (std::size_t i = 0; i < u.size(); ++i)
      worst = std::max(worst, std::fabs(u[i] - w[i]));
  };
  for (std::size_t i = 0; i < a.size(); ++i) {
    compare(a[i], b[i]);
    ParamState sa = oa.visible_state(a[i]), sb = ob.visible_state(b[i]);
    for (std::size_t k = 0; k < sa.size(); ++k)
      compare(sa[k].second, sb[k].second);
  }
  return worst;
}

} // namespace

int run_demo(Device device) {
  const bool gpu = device.kind == DeviceKind::cuda;
  const std::vector<Shape> shapes = mlp_shapes();
  int64_t elements = 0;
  std::vector<int64_t> numels;
  for (const Shape& s : shapes) {
    numels.push_back(shape_numel(s));
    elements += numels.back();
  }
  AdamOptions base;
  base.weight_decay = 0.01;
  std::printf("optjit demo: Adam(lr=0.001, weight_decay=0.01), 4-layer MLP 784-1024-1024-512-10: %zu params, "
              "%lld elements, f32, %d threads\n\n",
              shapes.size(), static_cast<long long>(elements), ThreadPool::global().active_threads());

  std::vector<Tensor> eager_params = random_params(shapes, Dtype::f32, 42);
  std::vector<Tensor> foreach_params = copy_params(eager_params);
  std::vector<Tensor> compiled_params = copy_params(eager_params);
  if (gpu)
    for (Tensor& p : compiled_params) {
      Tensor grad = p.grad();
      p = p.to(device);
      p.set_grad(grad.to(device));
    }
  AdamOptions forloop_options = base, foreach_options = base;
  forloop_options.foreach = false;
  foreach_options.foreach = true;
  Adam eager(eager_params, forloop_options), eager_foreach(foreach_params, foreach_options),
      compiled_opt(compiled_params, foreach_options);
  CompiledStep step = compile(compiled_opt);

  // The same 10 steps on all three paths, then compare.
  constexpr int kCheckedSteps = 10;
  for (int t = 0; t < kCheckedSteps; ++t) {
    eager.step();
    eager_foreach.step();
    step();
  }
  const double vs_forloop = max_difference(compiled_params, compiled_opt, eager_params, eager);
  const double vs_foreach = max_difference(compiled_params, compiled_opt, foreach_params, eager_foreach);
  const StepMetrics& m = step.metrics();
  std::printf("kernels per step      %d on %s   (PyTorch Inductor: 2 with foreach on a GPU, 8 single-tensor)\n",
              step.kernel_count(), device.to_string().c_str());
  std::printf("compile time          %.1f ms (trace, passes, LLVM; once: %lld compile, %lld recompiles)\n",
              m.compile_ms, static_cast<long long>(m.compiles), static_cast<long long>(m.recompiles));

  constexpr int kRepeats = 21;
  const double forloop_ms = median_ms(kRepeats, [&] { eager.step(); });
  const double foreach_ms = median_ms(kRepeats, [&] { eager_foreach.step(); });
  for (int t = 0; t < 3; ++t)
    step();
  const double compiled_ms =
      gpu ? device_median_ms(device.index, kRepeats, 10, [&] { step(); }) : median_ms(kRepeats, [&] { step(); });
  TrafficProbe probe(numels);
  probe.run();
  // The bar: a pass over the same bytes, on the CPU by the probe, on a GPU at its measured copy bandwidth.
  const double probe_ms = gpu ? 28.0 * static_cast<double>(elements) / device_copy_bandwidth(device.index) * 1e3
                              : median_ms(kRepeats, [&] { probe.run(); });
  std::printf("step time (median of %d)\n", kRepeats);
  std::printf("  eager, forloop      %8.3f ms\n", forloop_ms);
  std::printf("  eager, foreach      %8.3f ms  (interpreted foreach graph)\n", foreach_ms);
  std::printf("  compiled            %8.3f ms  (%.1fx faster than eager forloop%s)\n", compiled_ms,
              forloop_ms / compiled_ms, gpu ? " on the CPU; GPU time by CUDA events" : "");
  const double gb = static_cast<double>(probe.bytes_per_pass()) / 1e9;
  std::printf("bandwidth             compiled %.1f GB/s, %s %.1f GB/s (28 B/element): %.2fx its time\n",
              gb / (compiled_ms / 1e3), gpu ? "device copy" : "traffic probe", gb / (probe_ms / 1e3),
              compiled_ms / probe_ms);
  std::printf("dispatch per step     %.2f us (guards, binding, hyperparameters)\n",
              m.dispatch_ms * 1e3 / static_cast<double>(std::max<int64_t>(1, m.steps - m.compiles)));

  const bool agree = vs_forloop <= 1e-5 && vs_foreach <= 1e-5;
  std::printf("agreement             after %d steps, max |compiled - eager| over params and state: %.3g vs "
              "forloop, %.3g vs foreach: %s\n",
              kCheckedSteps, vs_forloop, vs_foreach, agree ? "OK" : "MISMATCH");
  return agree ? 0 : 1;
}

} // namespace optjit
