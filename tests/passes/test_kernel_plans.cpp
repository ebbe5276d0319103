// Plans of several kernels: apply_fusion hands a per-tensor value computed by kernel 1 to kernel 2 (a carried
// value), and the plan runs to the same result through the interpreter, through the CPU backend and as one
// fused kernel. The planner itself plans one kernel today (every op is pointwise); these plans are made by hand
// to hold the machinery the planner's splits at reductions will use.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "helpers.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/passes.h"
#include "runtime/error.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace optjit;

namespace {

// p <- p - lr / (1 - beta^(step+1)) * (beta * m + g); m <- beta * m + g; step <- step + 1.
const char* kBiasCorrected = R"(graph @g f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "m" : state tensor f32
  slot "step" : state scalar f32
  %0 = hyper "lr" : pt f64
  %1 = hyper "beta" : pt f64
  %2 = scalar_state "step" : pt f64
  %3 = constant 1 : pt f64
  %4 = add %2, %3 : pt f64
  %5 = pow %1, %4 : pt f64
  %6 = sub %3, %5 : pt f64
  %7 = div %0, %6 : pt f64
  %8 = cast %7 : pt f32
  %9 = cast %1 : pt f32
  %10 = tensor "param" : el f32
  %11 = tensor "grad" : el f32
  %12 = tensor "m" : el f32
  %13 = mul %12, %9 : el f32
  %14 = add %13, %11 : el f32
  %15 = mul %8, %14 : el f32
  %16 = sub %10, %15 : el f32
  store "param" %16
  store "m" %14
  store_scalar "step" %4
}
)";

// Every per-tensor node in kernel 0, every element node in kernel 1.
FusionPlan split_at_elements(const Graph& g) {
  FusionPlan plan;
  for (const Node& n : g.nodes)
    plan.kernel_of.push_back(n.level == Level::PerTensor ? 0 : 1);
  plan.kernel_count = 2;
  plan.decisions = {"by hand: per-tensor work in k0, element work in k1"};
  return plan;
}

// Three tensors (one of several work items, one tiny, one empty) with their grads, momentum and step.
struct State {
  std::vector<Tensor> param, grad, m, step;

  State() {
    for (int64_t n : {70001, 5, 0}) {
      std::vector<double> p(static_cast<std::size_t>(n)), g(p.size()), v(p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] = std::sin(0.1 * static_cast<double>(i) + static_cast<double>(n));
        g[i] = std::cos(0.37 * static_cast<double>(i));
        v[i] = 0.01 * static_cast<double>(i % 7);
      }
      param.push_back(Tensor::from_values({n}, p, Dtype::f32));
      grad.push_back(Tensor::from_values({n}, g, Dtype::f32));
      m.push_back(Tensor::from_values({n}, v, Dtype::f32));
      step.push_back(Tensor::from_values({1}, std::vector<double>{static_cast<double>(n % 3)}, Dtype::f32));
    }
  }

  ListArguments arguments() const {
    ListArguments args;
    args.slot_names = {"param", "grad", "m", "step"};
    args.slot_tensors = {param, grad, m, step};
    args.hyper_names = {"lr", "beta"};
    args.hyper = {0.01, 0.9};
    args.group_of = {0, 0, 0};
    return args;
  }

  std::vector<double> values() const {
    std::vector<double> all;
    for (const auto* list : {&param, &m, &step})
      for (const Tensor& t : *list)
        for (double v : t.to_vector())
          all.push_back(v);
    return all;
  }
};

} // namespace

TEST_CASE("pass fusion: a two-kernel plan hands a per-tensor value from kernel 1 to kernel 2") {
  const Graph g = parse_graph(kBiasCorrected);
  verify(g);
  const std::vector<KernelPlan> kernels = apply_fusion(g, split_at_elements(g));
  REQUIRE(kernels.size() == 2);
  CHECK(print_kernel_plan(kernels[0]) == R"(kernel @g_k0 f32
  tensor slots: -
  scalar slots: step
  hypers: lr, beta
  carries: c0, c1
  scratch: -
  tensor phase: %0..%9, element phase: %10..%9
graph @g_k0 f32 {
  slot "step" : state scalar f32
  %0 = hyper "lr" : pt f64
  %1 = hyper "beta" : pt f64
  %2 = scalar_state "step" : pt f64
  %3 = constant 1 : pt f64
  %4 = add %2, %3 : pt f64
  %5 = pow %1, %4 : pt f64
  %6 = sub %3, %5 : pt f64
  %7 = div %0, %6 : pt f64
  %8 = cast %7 : pt f32
  %9 = cast %1 : pt f32
  store_scalar "step" %4
  store_carry "c0" %9
  store_carry "c1" %8
}
)");
  CHECK(print_kernel_plan(kernels[1]) == R"(kernel @g_k1 f32
  tensor slots: param, grad, m
  scalar slots: -
  hypers: -
  carries: c0, c1
  scratch: %0, %1
  tensor phase: %0..%1, element phase: %2..%8
graph @g_k1 f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "m" : state tensor f32
  %0 = carried "c0" : pt f32
  %1 = carried "c1" : pt f32
  %2 = tensor "param" : el f32
  %3 = tensor "grad" : el f32
  %4 = tensor "m" : el f32
  %5 = mul %0, %4 : el f32
  %6 = add %3, %5 : el f32
  %7 = mul %1, %6 : el f32
  %8 = sub %2, %7 : el f32
  store "param" %8
  store "m" %6
}
)");
  CHECK(kernels[0].abi.carried_out == std::vector<std::string>{"c0", "c1"});
  CHECK(kernels[1].abi.carried_in == std::vector<std::string>{"c0", "c1"});
  CHECK(kernel_stats(g, kernels).kernels == 2);
}

TEST_CASE("pass fusion: the two-kernel plan runs like the graph through the interpreter and the CPU backend") {
  const Graph g = parse_graph(kBiasCorrected);
  PipelineResult two;
  two.traced = two.optimized = g;
  two.kernels = apply_fusion(g, split_at_elements(g));
  two.stats = kernel_stats(g, two.kernels);
  const PipelineResult one = run_pipeline(g);
  REQUIRE(one.kernels.size() == 1);

  State whole, interpreted, compiled_two, compiled_one;
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  bool hit = false;
  std::unique_ptr<Executable> two_kernels = backend_for(cpu).load(two, cpu, CompileOptions{}, hit);
  std::unique_ptr<Executable> one_kernel = backend_for(cpu).load(one, cpu, CompileOptions{}, hit);
  two_kernels->bind(compiled_two.arguments());
  one_kernel->bind(compiled_one.arguments());
  for (int step = 0; step < 3; ++step) {
    interpret(g, whole.arguments());
    interpret_kernels(two.kernels, interpreted.arguments());
    two_kernels->launch();
    one_kernel->launch();
  }
  const std::vector<double> expected = whole.values();
  CHECK(expected != State().values()); // the steps changed something
  CHECK(interpreted.values() == expected);
  CHECK(compiled_two.values() == expected);
  CHECK(compiled_one.values() == expected);
  CHECK(whole.step[0].item(0) == 3 + 70001 % 3);
}

TEST_CASE("kernel plans: the text of every kernel round trips, and a header that disagrees with the graph is named") {
  const Graph g = parse_graph(kBiasCorrected);
  std::vector<KernelPlan> plans = apply_fusion(g, split_at_elements(g));
  plans.push_back(run_pipeline(g).kernels.front());
  std::string all;
  for (const KernelPlan& plan : plans) {
    const std::string text = print_kernel_plan(plan);
    const KernelPlan parsed = parse_kernel_plan(text);
    CHECK(parsed == plan);
    CHECK(print_kernel_plan(parsed) == text);
    all += text;
  }
  CHECK(parse_kernel_plans(all) == plans);

  std::string wrong = print_kernel_plan(plans[1]);
  wrong.replace(wrong.find("scratch: %0, %1"), 15, "scratch: %1, %0");
  CHECK_THROWS_WITH_AS(
      parse_kernel_plan(wrong),
      "parse error: kernel plan line 6 reads '  scratch: %1, %0', but the graph gives '  scratch: %0, %1'", Error);
  std::string unlisted = print_kernel_plan(plans[1]);
  unlisted.replace(unlisted.find("carries: c0, c1"), 15, "carries: c0");
  CHECK_THROWS_WITH_AS(parse_kernel_plan(unlisted),
                       "kernel g_k1 uses carried value 'c1', which the plan's carries do not list", Error);
  // The header's name becomes the graph's and the kernel's symbol: one that is no identifier printed a graph that
  // did not parse back (found by the IR fuzzer).
  std::string odd_name = print_kernel_plan(plans[1]);
  odd_name.replace(0, std::string("kernel @g_k1").size(), "kernel @g+k1");
  CHECK_THROWS_WITH_AS(
      parse_kernel_plan(odd_name),
      "graph @g+k1: a graph's name is an identifier (letters, digits and _, not starting with a digit)", Error);
}

TEST_CASE("cuda ptx: a two-kernel plan assembles for sm_80 and sm_90") {
  const char* ptxas = "/usr/local/cuda/bin/ptxas";
  if (!std::filesystem::exists(ptxas)) {
    optjit::test::skip_test(std::string(ptxas) + " is absent (install the CUDA toolkit's ptxas to run this check)");
    return;
  }
  const Graph g = parse_graph(kBiasCorrected);
  const std::filesystem::path file = test::temp_path("two_kernels.ptx");
  for (const KernelPlan& plan : apply_fusion(g, split_at_elements(g)))
    for (int sm : {80, 90}) {
      INFO(plan.name << " sm_" << sm);
      const std::string ptx = compile_gpu_kernel(plan, sm).ptx;
      std::ofstream(file) << ptx;
      const std::string command =
          std::string(ptxas) + " --gpu-name sm_" + std::to_string(sm) + " " + file.string() + " -o /dev/null";
      CHECK(std::system(command.c_str()) == 0);
    }
  std::filesystem::remove(file);
}
