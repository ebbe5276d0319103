// Reductions: the planner splits a graph at its reductions into the fewest kernels (one more than the reductions on
// the longest path), hands their per-tensor results on as carried values, recomputes element values in the kernel
// that needs them again, and holds back a tensor store until the last kernel that loads its slot. The plan runs on
// the CPU backend like the interpreter runs the whole graph, and its sums do not depend on the thread count.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "ir/builder.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/passes.h"
#include "runtime/error.h"
#include "runtime/thread_pool.h"

#include <doctest/doctest.h>

#include <cmath>

using namespace optjit;

namespace {

// A per-tensor trust ratio, as LAMB's: u = m + g; p <- p - lr * (|p| / |u|) * u; m <- u.
const char* kTrustRatio = R"(graph @r f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "m" : state tensor f32
  %0 = hyper "lr" : pt f64
  %1 = tensor "param" : el f32
  %2 = tensor "grad" : el f32
  %3 = tensor "m" : el f32
  %4 = add %2, %3 : el f32
  %5 = mul %4, %4 : el f32
  %6 = reduce_sum %5 : pt f64
  %7 = mul %1, %1 : el f32
  %8 = reduce_sum %7 : pt f64
  %9 = sqrt %8 : pt f64
  %10 = sqrt %6 : pt f64
  %11 = div %9, %10 : pt f64
  %12 = mul %0, %11 : pt f64
  %13 = cast %12 : pt f32
  %14 = mul %4, %13 : el f32
  %15 = sub %1, %14 : el f32
  store "param" %15
  store "m" %4
}
)";

// Three tensors: several work items, a tiny one, an empty one.
struct Lists {
  std::vector<Tensor> param, grad, m;

  explicit Lists(Dtype dtype = Dtype::f32) {
    for (int64_t n : {70001, 5, 0}) {
      std::vector<double> p(static_cast<std::size_t>(n)), g(p.size()), v(p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] = std::sin(0.1 * static_cast<double>(i) + static_cast<double>(n));
        g[i] = std::cos(0.37 * static_cast<double>(i));
        v[i] = 0.01 * static_cast<double>(i % 7);
      }
      param.push_back(Tensor::from_values({n}, p, dtype));
      grad.push_back(Tensor::from_values({n}, g, dtype));
      m.push_back(Tensor::from_values({n}, v, dtype));
    }
  }
  ListArguments arguments() const {
    ListArguments args;
    args.slot_names = {"param", "grad", "m"};
    args.slot_tensors = {param, grad, m};
    args.hyper_names = {"lr"};
    args.hyper = {0.01};
    args.group_of = {0, 0, 0};
    return args;
  }
  std::vector<double> values() const {
    std::vector<double> all;
    for (const auto* list : {&param, &m})
      for (const Tensor& t : *list)
        for (double v : t.to_vector())
          all.push_back(v);
    return all;
  }
};

std::vector<double> run_compiled(const PipelineResult& pipeline, int steps) {
  Lists lists;
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  bool hit = false;
  std::unique_ptr<Executable> code = backend_for(cpu).load(pipeline, cpu, CompileOptions{}, hit);
  code->bind(lists.arguments());
  for (int step = 0; step < steps; ++step)
    code->launch();
  return lists.values();
}

} // namespace

TEST_CASE("pass fusion: a graph splits at its reductions, recomputing element values and holding back stores") {
  const Graph g = parse_graph(kTrustRatio);
  verify(g);
  const PipelineResult r = run_pipeline(g);
  REQUIRE(r.kernels.size() == 2);
  CHECK(r.stats.kernels == 2);
  CHECK(print_kernel_plan(r.kernels[0]) == R"(kernel @r_k0 f32
  tensor slots: param, grad, m
  scalar slots: -
  hypers: -
  carries: c0, c1
  scratch: -
  tensor phase: %0..%-1, element phase: %0..%5, reductions: %6..%7
graph @r_k0 f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "m" : state tensor f32
  %0 = tensor "param" : el f32
  %1 = tensor "grad" : el f32
  %2 = tensor "m" : el f32
  %3 = add %1, %2 : el f32
  %4 = mul %3, %3 : el f32
  %5 = mul %0, %0 : el f32
  %6 = reduce_sum %4 : pt f64
  %7 = reduce_sum %5 : pt f64
  store_carry "c0" %7
  store_carry "c1" %6
}
)");
  // The second kernel loads m again to recompute u, so m is stored there, not by the first; the trust ratio
  // |p| / |u| comes from the carried sums of squares.
  CHECK(print_kernel_plan(r.kernels[1]) == R"(kernel @r_k1 f32
  tensor slots: param, grad, m
  scalar slots: -
  hypers: lr
  carries: c0, c1
  scratch: %7
  tensor phase: %0..%7, element phase: %8..%13
graph @r_k1 f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "m" : state tensor f32
  %0 = carried "c0" : pt f64
  %1 = carried "c1" : pt f64
  %2 = hyper "lr" : pt f64
  %3 = sqrt %0 : pt f64
  %4 = sqrt %1 : pt f64
  %5 = div %3, %4 : pt f64
  %6 = mul %2, %5 : pt f64
  %7 = cast %6 : pt f32
  %8 = tensor "param" : el f32
  %9 = tensor "grad" : el f32
  %10 = tensor "m" : el f32
  %11 = add %9, %10 : el f32
  %12 = mul %7, %11 : el f32
  %13 = sub %8, %12 : el f32
  store "param" %13
  store "m" %11
}
)");
  CHECK(r.kernels[1].abi.carried_in == std::vector<std::string>{"c0", "c1"});
  CHECK(print_fused(r).find("refused: 1 join(s) across a reduction") != std::string::npos);
}

TEST_CASE("reductions: the two-kernel plan on the CPU follows the interpreter, empty and tiny tensors included") {
  const Graph g = parse_graph(kTrustRatio);
  Lists interpreted;
  for (int step = 0; step < 3; ++step)
    interpret(g, interpreted.arguments());
  const std::vector<double> expected = interpreted.values();
  CHECK(expected != Lists().values());
  const std::vector<double> compiled = run_compiled(run_pipeline(g), 3);
  REQUIRE(compiled.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) // summation orders differ: f32 rounding of the trust ratio
    REQUIRE(compiled[i] == doctest::Approx(expected[i]).epsilon(1e-5));
  // The plan's own kernels, interpreted one by one, mean the same as the whole graph.
  Lists by_kernels;
  const PipelineResult r = run_pipeline(g);
  for (int step = 0; step < 3; ++step)
    interpret_kernels(r.kernels, by_kernels.arguments());
  CHECK(by_kernels.values() == expected);
}

TEST_CASE("reductions: sums are bitwise the same for every thread count, compiled and interpreted") {
  const Graph g = parse_graph(kTrustRatio);
  const PipelineResult r = run_pipeline(g);
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  std::vector<std::vector<double>> compiled, interpreted;
  for (int active : {1, 2, threads}) {
    pool.set_active_threads(std::min(active, threads));
    compiled.push_back(run_compiled(r, 2));
    Lists lists;
    for (int step = 0; step < 2; ++step)
      interpret(g, lists.arguments());
    interpreted.push_back(lists.values());
  }
  pool.set_active_threads(threads);
  CHECK(compiled[0] == compiled[1]);
  CHECK(compiled[0] == compiled[2]);
  CHECK(interpreted[0] == interpreted[1]);
  CHECK(interpreted[0] == interpreted[2]);
}

TEST_CASE("reductions: reduce_max propagates NaN, an empty tensor reduces to the identity") {
  const Graph g = parse_graph(R"(graph @mx f64 {
  slot "param" : param tensor f64
  slot "grad" : grad tensor f64
  slot "peak" : state scalar f64
  slot "total" : state scalar f64
  %0 = tensor "grad" : el f64
  %1 = abs %0 : el f64
  %2 = reduce_max %1 : pt f64
  %3 = reduce_sum %0 : pt f64
  store_scalar "peak" %2
  store_scalar "total" %3
}
)");
  const PipelineResult r = run_pipeline(g);
  REQUIRE(r.kernels.size() == 2); // the scalar stores read the reductions in the next kernel
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    std::vector<Tensor> grads = {Tensor::from_values({4}, std::vector<double>{1.0, -7.5, 2.0, 0.0}, Dtype::f64),
                                 Tensor::from_values({2}, std::vector<double>{1.0, std::nan("")}, Dtype::f64),
                                 Tensor::from_values({0}, std::vector<double>{}, Dtype::f64)};
    std::vector<Tensor> params, peak, total;
    for (const Tensor& grad : grads) {
      params.push_back(Tensor::zeros(grad.shape(), Dtype::f64));
      peak.push_back(Tensor::zeros({1}, Dtype::f64));
      total.push_back(Tensor::zeros({1}, Dtype::f64));
    }
    ListArguments args;
    args.slot_names = {"param", "grad", "peak", "total"};
    args.slot_tensors = {params, grads, peak, total};
    args.group_of = {0, 0, 0};
    if (compiled) {
      const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
      bool hit = false;
      std::unique_ptr<Executable> code = backend_for(cpu).load(r, cpu, CompileOptions{}, hit);
      code->bind(args);
      code->launch();
    } else {
      interpret(g, args);
    }
    CHECK(peak[0].item(0) == 7.5);
    CHECK(total[0].item(0) == -4.5);
    CHECK(std::isnan(peak[1].item(0)));
    CHECK(std::isnan(total[1].item(0)));
    CHECK(peak[2].item(0) == -INFINITY);
    CHECK(total[2].item(0) == 0.0);
  }
}

TEST_CASE("reductions: the builder refuses a reduction of a per-tensor value, and a kernel that uses its own sum") {
  CHECK_THROWS_WITH_AS(parse_graph(R"(graph @bad f64 {
  slot "param" : param tensor f64
  %0 = constant 2 : pt f64
  %1 = reduce_sum %0 : pt f64
}
)"),
                       doctest::Contains("a reduction reduces an element value over each tensor"), Error);
  Graph g = parse_graph(R"(graph @own f64 {
  slot "param" : param tensor f64
  slot "total" : state scalar f64
  %0 = tensor "param" : el f64
  %1 = reduce_sum %0 : pt f64
  store_scalar "total" %1
}
)");
  CHECK_THROWS_WITH_AS(make_kernel_plan("own_k0", g, {}), doctest::Contains("in the kernel that computes it"), Error);
}

namespace {

// Adafactor's factored second moment: row and column means of g^2 (lerped into rows and cols state), their outer
// product over the mean of the new row variances, and an update scaled by it.
Graph factored_graph() {
  GraphBuilder b("fac", Dtype::f64);
  b.declare_slot({"param", SlotRole::Param, SlotKind::Tensor, Dtype::f64, {}});
  b.declare_slot({"grad", SlotRole::Grad, SlotKind::Tensor, Dtype::f64, {}});
  b.declare_slot({"row_var", SlotRole::State, SlotKind::Rows, Dtype::f64, {}});
  b.declare_slot({"col_var", SlotRole::State, SlotKind::Cols, Dtype::f64, {}});
  const ValueId w = b.hyper("w"), lr = b.hyper("lr");
  const ValueId n = b.add(Node{Op::extent, {}, {}, {}, 0, "n"}), m = b.add(Node{Op::extent, {}, {}, {}, 0, "m"});
  const ValueId g = b.tensor("grad"), g2 = b.binary(Op::mul, g, g);
  const auto lerp = [&](ValueId from, ValueId to) {
    return b.binary(Op::add, from, b.binary(Op::mul, w, b.binary(Op::sub, to, from)));
  };
  const ValueId rows = lerp(b.tensor("row_var"), b.binary(Op::div, b.reduce(Op::row_sum, g2), n));
  const ValueId cols = lerp(b.tensor("col_var"), b.binary(Op::div, b.reduce(Op::col_sum, g2), m));
  const ValueId row_mean = b.binary(Op::div, b.reduce(Op::col_sum, rows), m);
  const ValueId v = b.binary(Op::div, b.binary(Op::mul, rows, cols), row_mean);
  const ValueId update = b.binary(Op::div, g, b.unary(Op::sqrt, v));
  b.store("param", b.binary(Op::sub, b.tensor("param"), b.binary(Op::mul, lr, update)));
  b.store("row_var", rows);
  b.store("col_var", cols);
  return b.finish();
}

struct Factored {
  std::vector<Tensor> param, grad, rows, cols;
  explicit Factored(const std::vector<Shape>& shapes) {
    int k = 0;
    for (const Shape& s : shapes) {
      std::vector<double> p(static_cast<std::size_t>(shape_numel(s))), g(p.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] = std::sin(0.3 * static_cast<double>(i) + k);
        g[i] = std::cos(0.7 * static_cast<double>(i) + 2 * k) + 0.1;
      }
      param.push_back(Tensor::from_values(s, p, Dtype::f64));
      grad.push_back(Tensor::from_values(s, g, Dtype::f64));
      Shape r = s, c = s;
      r.back() = 1;
      c[c.size() - 2] = 1;
      rows.push_back(Tensor::full(r, 0.5, Dtype::f64));
      cols.push_back(Tensor::full(c, 0.25, Dtype::f64));
      ++k;
    }
  }
  ListArguments arguments() const {
    ListArguments args;
    args.slot_names = {"param", "grad", "row_var", "col_var"};
    args.slot_tensors = {param, grad, rows, cols};
    args.hyper_names = {"w", "lr"};
    args.hyper = {0.3, 0.01};
    args.group_of.assign(param.size(), 0);
    for (const Tensor& p : param)
      args.shapes.push_back(p.shape());
    return args;
  }
  std::vector<double> values() const {
    std::vector<double> all;
    for (const auto* list : {&param, &rows, &cols})
      for (const Tensor& t : *list)
        for (double x : t.to_vector())
          all.push_back(x);
    return all;
  }
};

} // namespace

TEST_CASE("axis reductions: row and column sums split the plan and run on the CPU as the interpreter runs them") {
  const Graph g = factored_graph();
  verify(g);
  const PipelineResult r = run_pipeline(g);
  REQUIRE(r.kernels.size() == 3);
  // g^2's row and column sums, carried as a rows array and a columns array.
  CHECK(print_kernel_plan(r.kernels[0]) == R"(kernel @fac_k0 f64
  tensor slots: grad
  scalar slots: -
  hypers: -
  carries: c0 (rows), c1 (cols), c2 (cols)
  scratch: -
  tensor phase: %0..%-1, element phase: %0..%1, reductions: %2..%3
graph @fac_k0 f64 {
  slot "grad" : grad tensor f64
  %0 = tensor "grad" : el f64
  %1 = mul %0, %0 : el f64
  %2 = row_sum %1 : el f64
  %3 = col_sum %1 : el f64
  store_carry "c0" %2
  store_carry "c1" %3
}
)");
  // The new row variances from the carried row sums, and their sum over the rows (the row mean's numerator); row_var
  // itself is stored by the last kernel, which reads its old values again.
  CHECK(print_kernel_plan(r.kernels[1]) == R"(kernel @fac_k1 f64
  tensor slots: row_var
  scalar slots: -
  hypers: w
  carries: c0 (rows), c1 (cols), c2 (cols)
  scratch: %1, %0
  tensor phase: %0..%1, element phase: %2..%7, reductions: %8..%8
graph @fac_k1 f64 {
  slot "row_var" : state rows f64
  %0 = hyper "w" : pt f64
  %1 = extent "n" : pt f64
  %2 = tensor "row_var" : el f64
  %3 = carried_rows "c0" : el f64
  %4 = div %3, %1 : el f64
  %5 = sub %4, %2 : el f64
  %6 = mul %0, %5 : el f64
  %7 = add %2, %6 : el f64
  %8 = col_sum %7 : el f64
  store_carry "c2" %8
}
)");
  // The update: rows and columns recomputed from the carried sums (element values never cross kernels), then every
  // store, held back until no later kernel loads the old values.
  CHECK(print_kernel_plan(r.kernels[2]) == R"(kernel @fac_k2 f64
  tensor slots: grad, row_var, col_var, param
  scalar slots: -
  hypers: w, lr
  carries: c0 (rows), c1 (cols), c2 (cols)
  scratch: %2, %0, %3, %1
  tensor phase: %0..%3, element phase: %4..%25
graph @fac_k2 f64 {
  slot "param" : param tensor f64
  slot "grad" : grad tensor f64
  slot "row_var" : state rows f64
  slot "col_var" : state cols f64
  %0 = hyper "w" : pt f64
  %1 = hyper "lr" : pt f64
  %2 = extent "n" : pt f64
  %3 = extent "m" : pt f64
  %4 = tensor "grad" : el f64
  %5 = tensor "row_var" : el f64
  %6 = tensor "col_var" : el f64
  %7 = tensor "param" : el f64
  %8 = carried_rows "c0" : el f64
  %9 = div %8, %2 : el f64
  %10 = sub %9, %5 : el f64
  %11 = mul %0, %10 : el f64
  %12 = add %5, %11 : el f64
  %13 = carried_cols "c1" : el f64
  %14 = div %13, %3 : el f64
  %15 = sub %14, %6 : el f64
  %16 = mul %0, %15 : el f64
  %17 = add %6, %16 : el f64
  %18 = mul %12, %17 : el f64
  %19 = carried_cols "c2" : el f64
  %20 = div %19, %3 : el f64
  %21 = div %18, %20 : el f64
  %22 = sqrt %21 : el f64
  %23 = div %4, %22 : el f64
  %24 = mul %1, %23 : el f64
  %25 = sub %7, %24 : el f64
  store "param" %25
  store "row_var" %12
  store "col_var" %17
}
)");
  for (const KernelPlan& k : r.kernels)
    CHECK(parse_kernel_plan(print_kernel_plan(k)) == k);
  const std::vector<Shape> shapes = {{6, 5}, {2, 3, 4}, {1, 7}, {4, 1}};
  Factored whole(shapes), by_kernels(shapes), compiled(shapes);
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  bool hit = false;
  std::unique_ptr<Executable> code = backend_for(cpu).load(r, cpu, CompileOptions{}, hit);
  code->bind(compiled.arguments());
  for (int step = 0; step < 3; ++step) {
    interpret(g, whole.arguments());
    interpret_kernels(r.kernels, by_kernels.arguments());
    code->launch();
  }
  const std::vector<double> expected = whole.values();
  CHECK(expected != Factored(shapes).values());
  CHECK(by_kernels.values() == expected);
  const std::vector<double> got = compiled.values();
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
  }
  // Row 0 of the first param's new row variance by hand: lerp(0.5, mean of its g^2, 0.3) after one step.
  Factored once(shapes);
  interpret(g, once.arguments());
  double mean = 0;
  for (int j = 0; j < 5; ++j)
    mean += std::pow(std::cos(0.7 * j) + 0.1, 2) / 5;
  CHECK(once.rows[0].item(0) == doctest::Approx(0.5 + 0.3 * (mean - 0.5)).epsilon(1e-14));
}

TEST_CASE("axis reductions: a tensor of rank 1 has no rows") {
  const Graph g = factored_graph();
  Factored f({{6, 5}});
  ListArguments args = f.arguments();
  args.slot_tensors[0] = {Tensor::zeros({30}, Dtype::f64)};
  args.slot_tensors[1] = {Tensor::zeros({30}, Dtype::f64)};
  args.shapes = {{30}};
  CHECK_THROWS_WITH_AS(interpret(g, args), doctest::Contains("rows and columns need a tensor of rank 2 or more"),
                       Error);
}
