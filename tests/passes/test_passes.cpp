// Each pass on a small graph: the IR before, the IR expected after (printer text), and what it must not touch.
#include "compiler/pipeline.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/passes.h"

#include <doctest/doctest.h>

using namespace optjit;

namespace {

// Parses `before`, runs `pass`, verifies, and compares the printed result with `expected`.
template <class Pass> void check_pass(Pass pass, const std::string& before, const std::string& expected) {
  Graph in = parse_graph(before);
  verify(in);
  const std::string input_text = print_graph(in);
  Graph out = pass(in);
  verify(out);
  CHECK(print_graph(out) == expected);
  CHECK(print_graph(in) == input_text); // passes never mutate their input
}

} // namespace

// Casts of constants stay casts (constants are f64 scalars); x * cast(1) goes, x * 0 and x - x stay (NaN, inf).
TEST_CASE("pass fold_constants: folds constant scalar math and exact identities only") {
  check_pass(fold_constants,
             R"(graph @g f32 {
  slot "x" : state tensor f32
  slot "y" : state tensor f32
  %0 = constant 1 : pt f64
  %1 = constant 0.9 : pt f64
  %2 = sub %0, %1 : pt f64
  %3 = tensor "x" : el f32
  %4 = cast %2 : pt f32
  %5 = mul %3, %4 : el f32
  %6 = cast %0 : pt f32
  %7 = mul %5, %6 : el f32
  %8 = constant 0 : pt f64
  %9 = cast %8 : pt f32
  %10 = mul %7, %9 : el f32
  %11 = sub %7, %7 : el f32
  store "x" %10
  store "y" %11
}
)",
             R"(graph @g f32 {
  slot "x" : state tensor f32
  slot "y" : state tensor f32
  %0 = constant 1 : pt f64
  %1 = constant 0.9 : pt f64
  %2 = constant 0.09999999999999998 : pt f64
  %3 = tensor "x" : el f32
  %4 = cast %2 : pt f32
  %5 = mul %3, %4 : el f32
  %6 = cast %0 : pt f32
  %7 = constant 0 : pt f64
  %8 = cast %7 : pt f32
  %9 = mul %5, %8 : el f32
  %10 = sub %5, %5 : el f32
  store "x" %9
  store "y" %10
}
)");
}

TEST_CASE("pass cse: identical nodes become one, commutative operands in either order included") {
  check_pass(eliminate_common_subexpressions,
             R"(graph @g f64 {
  slot "x" : state tensor f64
  slot "y" : state tensor f64
  %0 = tensor "x" : el f64
  %1 = tensor "y" : el f64
  %2 = mul %0, %1 : el f64
  %3 = mul %1, %0 : el f64
  %4 = sub %0, %1 : el f64
  %5 = sub %1, %0 : el f64
  %6 = add %2, %3 : el f64
  %7 = add %4, %5 : el f64
  store "x" %6
  store "y" %7
}
)",
             R"(graph @g f64 {
  slot "x" : state tensor f64
  slot "y" : state tensor f64
  %0 = tensor "x" : el f64
  %1 = tensor "y" : el f64
  %2 = mul %0, %1 : el f64
  %3 = sub %0, %1 : el f64
  %4 = sub %1, %0 : el f64
  %5 = add %2, %2 : el f64
  %6 = add %3, %4 : el f64
  store "x" %5
  store "y" %6
}
)");
}

TEST_CASE("pass dce: removes what no store needs, keeps the order of the rest") {
  check_pass(eliminate_dead_code,
             R"(graph @g f32 {
  slot "x" : state tensor f32
  %0 = hyper "lr" : pt f64
  %1 = hyper "unused" : pt f64
  %2 = tensor "x" : el f32
  %3 = sqrt %2 : el f32
  %4 = cast %0 : pt f32
  %5 = mul %2, %4 : el f32
  store "x" %5
}
)",
             R"(graph @g f32 {
  slot "x" : state tensor f32
  %0 = hyper "lr" : pt f64
  %1 = tensor "x" : el f32
  %2 = cast %0 : pt f32
  %3 = mul %1, %2 : el f32
  store "x" %3
}
)");
}

TEST_CASE("pass hoist_scalars: every per-tensor value moves before the first element value") {
  check_pass(hoist_scalars,
             R"(graph @g f32 {
  slot "x" : state tensor f32
  slot "step" : state scalar f32
  %0 = tensor "x" : el f32
  %1 = scalar_state "step" : pt f64
  %2 = constant 1 : pt f64
  %3 = add %1, %2 : pt f64
  %4 = sqrt %0 : el f32
  %5 = cast %3 : pt f32
  %6 = mul %4, %5 : el f32
  store "x" %6
  store_scalar "step" %3
}
)",
             R"(graph @g f32 {
  slot "x" : state tensor f32
  slot "step" : state scalar f32
  %0 = scalar_state "step" : pt f64
  %1 = constant 1 : pt f64
  %2 = add %0, %1 : pt f64
  %3 = cast %2 : pt f32
  %4 = tensor "x" : el f32
  %5 = sqrt %4 : el f32
  %6 = mul %3, %5 : el f32
  store "x" %6
  store_scalar "step" %2
}
)");
}

TEST_CASE("pass fusion: two independent update chains over one tensor list become one kernel") {
  const char* hoisted = R"(graph @g f32 {
  slot "x" : state tensor f32
  slot "y" : state tensor f32
  %0 = hyper "a" : pt f64
  %1 = hyper "b" : pt f64
  %2 = cast %0 : pt f32
  %3 = cast %1 : pt f32
  %4 = tensor "x" : el f32
  %5 = tensor "y" : el f32
  %6 = mul %2, %4 : el f32
  %7 = mul %3, %5 : el f32
  store "x" %6
  store "y" %7
}
)";
  Graph g = parse_graph(hoisted);
  FusionPlan plan = plan_fusion(g);
  CHECK(plan.kernel_count == 1);
  REQUIRE(plan.kernel_of.size() == 8);
  for (int k : plan.kernel_of)
    CHECK(k == 0);
  const std::vector<KernelPlan> kernels = apply_fusion(g, plan);
  REQUIRE(kernels.size() == 1);
  CHECK(print_kernel_plan(kernels[0]) == R"(kernel @g_k0 f32
  tensor slots: x, y
  scalar slots: -
  hypers: a, b
  carries: -
  scratch: %2, %3
  tensor phase: %0..%3, element phase: %4..%7
graph @g_k0 f32 {
  slot "x" : state tensor f32
  slot "y" : state tensor f32
  %0 = hyper "a" : pt f64
  %1 = hyper "b" : pt f64
  %2 = cast %0 : pt f32
  %3 = cast %1 : pt f32
  %4 = tensor "x" : el f32
  %5 = tensor "y" : el f32
  %6 = mul %2, %4 : el f32
  %7 = mul %3, %5 : el f32
  store "x" %6
  store "y" %7
}
)");
  KernelStats stats = kernel_stats(g, kernels);
  CHECK(stats.kernels == 1);
  CHECK(stats.unfused_kernels == 2);
  CHECK(stats.element_ops == 2);
  CHECK(stats.bytes_per_element == 16); // read x, y; write x, y (f32)
}

TEST_CASE("pass fusion: a graph without stores needs no kernel") {
  Graph g = parse_graph("graph @g f32 {\n  slot \"x\" : state tensor f32\n  %0 = tensor \"x\" : el f32\n}\n");
  CHECK(plan_fusion(g).kernel_count == 0);
  CHECK(apply_fusion(g, plan_fusion(g)).empty());
}

TEST_CASE("pipeline: the optimized Adam-like graph keeps one kernel and moves no intermediate to memory") {
  Graph g = parse_graph(R"(graph @g f32 {
  slot "p" : param tensor f32
  slot "g" : grad tensor f32
  %0 = tensor "p" : el f32
  %1 = tensor "g" : el f32
  %2 = hyper "lr" : pt f64
  %3 = cast %2 : pt f32
  %4 = mul %1, %3 : el f32
  %5 = sub %0, %4 : el f32
  %6 = mul %3, %1 : el f32
  %7 = sub %0, %6 : el f32
  store "p" %7
}
)");
  PipelineResult r = run_pipeline(g);
  CHECK(r.stats.kernels == 1);
  CHECK(r.optimized.size() == 6); // the duplicate mul and the dead sub are gone
  CHECK(r.stats.bytes_per_element == 12);
}
