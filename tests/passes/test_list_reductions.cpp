// List reductions (list_sum, list_max): a per-tensor value combined over every tensor of the list, as a global grad
// norm is. The kernel that computes the operand stores it as the reduction's carry, the host combines it over the
// list when that kernel has ended, and later kernels read the combined value: clipping by the global norm is two
// kernels, the norm pass and the update. Compiled, interpreted whole and interpreted kernel by kernel agree with a
// hand computation, bitwise for every thread count; their GPU kernels assemble (tests/codegen/test_cuda.cpp).
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/pipeline.h"
#include "ir/interpreter.h"
#include "ir/kernel_plan.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "runtime/error.h"
#include "runtime/thread_pool.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

using namespace optjit;

namespace {

// SGD on grads clipped by their global 2-norm: p <- p - lr * g * min(1, max_norm / (|g|_global + 1e-6)); the
// largest |g| over the list is kept too.
const char* kGlobalClip = R"(graph @clip f64 {
  slot "param" : param tensor f64
  slot "grad" : grad tensor f64
  slot "peak" : state scalar f64
  %0 = hyper "lr" : pt f64
  %1 = hyper "max_norm" : pt f64
  %2 = constant 1e-06 : pt f64
  %3 = constant 1 : pt f64
  %4 = tensor "param" : el f64
  %5 = tensor "grad" : el f64
  %6 = mul %5, %5 : el f64
  %7 = reduce_sum %6 : pt f64
  %8 = abs %5 : el f64
  %9 = reduce_max %8 : pt f64
  %10 = list_sum %7 : pt f64
  %11 = list_max %9 : pt f64
  %12 = sqrt %10 : pt f64
  %13 = add %12, %2 : pt f64
  %14 = div %1, %13 : pt f64
  %15 = minimum %14, %3 : pt f64
  %16 = mul %0, %15 : pt f64
  %17 = mul %5, %16 : el f64
  %18 = sub %4, %17 : el f64
  store "param" %18
  store_scalar "peak" %11
}
)";

struct Lists {
  std::vector<Tensor> param, grad, peak;
  Lists() {
    for (int64_t n : {70001, 5, 0, 3}) {
      std::vector<double> p(static_cast<std::size_t>(n)), g(p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] = std::sin(0.1 * static_cast<double>(i) + static_cast<double>(n));
        g[i] = std::cos(0.37 * static_cast<double>(i) + static_cast<double>(n));
      }
      param.push_back(Tensor::from_values({n}, p, Dtype::f64));
      grad.push_back(Tensor::from_values({n}, g, Dtype::f64));
      peak.push_back(Tensor::zeros({1}, Dtype::f64));
    }
  }
  ListArguments arguments() const {
    ListArguments args;
    args.slot_names = {"param", "grad", "peak"};
    args.slot_tensors = {param, grad, peak};
    args.hyper_names = {"lr", "max_norm"};
    args.hyper = {0.1, 2.0};
    args.group_of = {0, 0, 0, 0};
    return args;
  }
  std::vector<double> values() const {
    std::vector<double> all;
    for (const auto* list : {&param, &peak})
      for (const Tensor& t : *list)
        for (double v : t.to_vector())
          all.push_back(v);
    return all;
  }
};

std::vector<double> run_compiled(const PipelineResult& pipeline) {
  Lists lists;
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  bool hit = false;
  std::unique_ptr<Executable> code = backend_for(cpu).load(pipeline, cpu, CompileOptions{}, hit);
  code->bind(lists.arguments());
  code->launch();
  return lists.values();
}

} // namespace

TEST_CASE("list reductions: clipping by the global norm is two kernels, and every way of running it agrees") {
  const Graph g = parse_graph(kGlobalClip);
  const PipelineResult r = run_pipeline(g);
  INFO(print_fused(r));
  REQUIRE(r.kernels.size() == 2);
  CHECK(print_fused(r).find("then the host combines") != std::string::npos);
  const std::string plans = print_kernel_plan(r.kernels[0]) + print_kernel_plan(r.kernels[1]);
  // The norm pass carries each tensor's sum of squares and largest |g| out as the list reductions' operands; the
  // update reads them back combined (the clip coefficient in its tensor phase), and stores the peak.
  CHECK(plans == R"(kernel @clip_k0 f64
  tensor slots: grad
  scalar slots: -
  hypers: -
  carries: c0 (list sum), c1 (list max)
  scratch: -
  tensor phase: %0..%-1, element phase: %0..%2, reductions: %3..%4
graph @clip_k0 f64 {
  slot "grad" : grad tensor f64
  %0 = tensor "grad" : el f64
  %1 = mul %0, %0 : el f64
  %2 = abs %0 : el f64
  %3 = reduce_sum %1 : pt f64
  %4 = reduce_max %2 : pt f64
  store_carry "c0" %3
  store_carry "c1" %4
}
kernel @clip_k1 f64
  tensor slots: param, grad
  scalar slots: peak
  hypers: lr, max_norm
  carries: c0 (list sum), c1 (list max)
  scratch: %10
  tensor phase: %0..%10, element phase: %11..%14
graph @clip_k1 f64 {
  slot "param" : param tensor f64
  slot "grad" : grad tensor f64
  slot "peak" : state scalar f64
  %0 = carried "c0" : pt f64
  %1 = carried "c1" : pt f64
  %2 = hyper "lr" : pt f64
  %3 = hyper "max_norm" : pt f64
  %4 = constant 1e-06 : pt f64
  %5 = constant 1 : pt f64
  %6 = sqrt %0 : pt f64
  %7 = add %4, %6 : pt f64
  %8 = div %3, %7 : pt f64
  %9 = minimum %5, %8 : pt f64
  %10 = mul %2, %9 : pt f64
  %11 = tensor "param" : el f64
  %12 = tensor "grad" : el f64
  %13 = mul %10, %12 : el f64
  %14 = sub %11, %13 : el f64
  store "param" %14
  store_scalar "peak" %1
}
)");
  CHECK(parse_kernel_plans(plans) == r.kernels); // the carries' kinds print and parse back
  for (const KernelPlan& kernel : r.kernels)     // ordinary GPU kernels: the GPU backend combines on the host
    CHECK(compile_gpu_kernel(kernel, 80).ptx.find(".entry") != std::string::npos);

  // By hand: the global norm over every tensor, then the update.
  Lists expected;
  double squares = 0, peak = -INFINITY;
  for (const Tensor& grad : expected.grad)
    for (double v : grad.to_vector()) {
      squares += v * v;
      peak = std::max(peak, std::fabs(v));
    }
  const double coef = 0.1 * std::min(2.0 / (std::sqrt(squares) + 1e-6), 1.0);
  for (std::size_t t = 0; t < expected.param.size(); ++t) {
    std::vector<double> p = expected.param[t].to_vector(), grad = expected.grad[t].to_vector();
    for (std::size_t i = 0; i < p.size(); ++i)
      p[i] -= grad[i] * coef;
    expected.param[t] = Tensor::from_values(expected.param[t].shape(), p, Dtype::f64);
    expected.peak[t].fill(peak);
  }
  const std::vector<double> want = expected.values();
  REQUIRE(coef < 0.1); // the clip is active
  Lists whole, by_kernels;
  interpret(g, whole.arguments());
  interpret_kernels(r.kernels, by_kernels.arguments());
  for (const std::vector<double>& got : {run_compiled(r), whole.values(), by_kernels.values()}) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      REQUIRE(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
}

TEST_CASE("list reductions: bitwise the same for every thread count, compiled") {
  const PipelineResult r = run_pipeline(parse_graph(kGlobalClip));
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  std::vector<std::vector<double>> runs;
  for (int active : {1, 2, threads}) {
    pool.set_active_threads(std::min(active, threads));
    runs.push_back(run_compiled(r));
  }
  pool.set_active_threads(threads);
  CHECK(runs[0] == runs[1]);
  CHECK(runs[0] == runs[2]);
}

TEST_CASE("list reductions: a list reduction of a per-tensor value ends its kernel") {
  // The sum of every tensor's element count: computed in kernel 0's tensor phase, combined after it.
  const PipelineResult r = run_pipeline(parse_graph(R"(graph @count f64 {
  slot "param" : param tensor f64
  slot "total" : state scalar f64
  %0 = extent "numel" : pt f64
  %1 = list_sum %0 : pt f64
  store_scalar "total" %1
}
)"));
  REQUIRE(r.kernels.size() == 2);
  std::vector<Tensor> params = {Tensor::zeros({3, 4}, Dtype::f64), Tensor::zeros({7}, Dtype::f64)};
  std::vector<Tensor> totals = {Tensor::zeros({1}, Dtype::f64), Tensor::zeros({1}, Dtype::f64)};
  ListArguments args;
  args.slot_names = {"param", "total"};
  args.slot_tensors = {params, totals};
  args.group_of = {0, 0};
  args.shapes = {{3, 4}, {7}};
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  bool hit = false;
  std::unique_ptr<Executable> code = backend_for(cpu).load(r, cpu, CompileOptions{}, hit);
  code->bind(args);
  code->launch();
  CHECK(totals[0].item(0) == 19);
  CHECK(totals[1].item(0) == 19);
}

TEST_CASE("list reductions: the builder takes per-tensor f64 values only, and not a list reduction's own result") {
  CHECK_THROWS_WITH_AS(parse_graph(R"(graph @bad f64 {
  slot "param" : param tensor f64
  %0 = tensor "param" : el f64
  %1 = list_sum %0 : pt f64
}
)"),
                       doctest::Contains("a list reduction combines a per-tensor f64 value over the list's tensors"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_graph(R"(graph @bad f32 {
  slot "param" : param tensor f32
  %0 = constant 2 : pt f64
  %1 = cast %0 : pt f32
  %2 = list_max %1 : pt f64
}
)"),
                       doctest::Contains("a list reduction combines a per-tensor f64 value"), Error);
  CHECK_THROWS_WITH_AS(parse_graph(R"(graph @bad f64 {
  slot "param" : param tensor f64
  %0 = constant 2 : pt f64
  %1 = list_sum %0 : pt f64
  %2 = list_sum %1 : pt f64
}
)"),
                       doctest::Contains("already the same for every tensor of the list"), Error);
}
