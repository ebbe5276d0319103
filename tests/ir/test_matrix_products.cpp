// Matrix products in the IR (ops mm and addmm, ir/ops.def): the builder's rules, printing and parsing back, the
// interpreter's meaning (torch.addmm in bf16: operands rounded, f32 sums, one rounding) checked against the library
// and a double sum, shapes that do not fit, and the pipeline leaving such graphs unplanned.
#include "compiler/backend.h"
#include "compiler/pipeline.h"
#include "ir/builder.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/error.h"
#include "runtime/low_precision.h"

#include "helpers.h"

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <set>

using namespace optjit;
using namespace optjit::test;

namespace {

// x <- addmm(x, mm(x, x^T), x, beta, alpha) over one f32 tensor slot, `iterations` times: Muon's iteration on a wide
// matrix.
Graph iteration_graph(const std::string& form_dtype = "bf16", int iterations = 1) {
  GraphBuilder b("iteration", Dtype::f32);
  b.declare_slot({"x", SlotRole::Param, SlotKind::Tensor, Dtype::f32, {}});
  ValueId x = b.tensor("x");
  for (int i = 0; i < iterations; ++i) {
    const ValueId gram = b.add(Node{Op::mm, Level::Element, Dtype::f32, {x, x}, 0, "nt " + form_dtype});
    x = b.add(Node{
        Op::addmm, Level::Element, Dtype::f32, {x, gram, x, b.hyper("beta"), b.hyper("alpha")}, 0, "nn " + form_dtype});
  }
  b.store("x", x);
  return b.finish();
}

ListArguments arguments_for(const Tensor& x, double beta, double alpha) {
  ListArguments args;
  args.slot_names = {"x"};
  args.slot_tensors = {{x}};
  args.hyper_names = {"beta", "alpha"};
  args.hyper = {beta, alpha};
  args.group_of = {0};
  return args;
}

} // namespace

TEST_CASE("matrix products: mm and addmm print and parse back, and the builder names what is wrong") {
  const Graph g = iteration_graph();
  verify(g);
  const std::string text = print_graph(g);
  CHECK(text.find("mm \"nt bf16\" %0, %0 : el f32") != std::string::npos);
  CHECK(parse_graph(text) == g);
  GraphBuilder b("bad", Dtype::f32);
  b.declare_slot({"x", SlotRole::Param, SlotKind::Tensor, Dtype::f32, {}});
  const ValueId x = b.tensor("x"), lr = b.hyper("lr");
  check_error_contains(
      [&] {
        b.add(Node{Op::mm, Level::Element, Dtype::f32, {x, x}, 0, "nx bf16"});
      },
      "\"<n|t><n|t> <bf16|f32>\"");
  check_error_contains(
      [&] {
        b.add(Node{Op::mm, Level::Element, Dtype::f32, {x, x}, 0, "nn f16"});
      },
      "\"<n|t><n|t> <bf16|f32>\"");
  check_error_contains(
      [&] {
        b.add(Node{Op::mm, Level::Element, Dtype::f32, {x, lr}, 0, "nn f32"});
      },
      "its matrices are element values");
  check_error_contains(
      [&] {
        b.add(Node{Op::addmm, Level::Element, Dtype::f32, {x, x, x, x, lr}, 0, "nn f32"});
      },
      "takes beta and alpha as per-tensor f64 values");
}

TEST_CASE("matrix products: the interpreter computes torch's bf16 addmm, one rounding of the f32 sum") {
  const int64_t m = 5, n = 9;
  std::vector<double> values;
  for (int64_t i = 0; i < m * n; ++i)
    values.push_back(static_cast<double>(bfloat16(static_cast<float>(std::sin(1.3 * static_cast<double>(i))))));
  const Tensor x = Tensor::from_values({m, n}, values, Dtype::f32);
  const double beta = -0.75, alpha = 1.5;
  interpret(iteration_graph(), arguments_for(x, beta, alpha));
  // The reference: the Gram matrix rounded to bf16, then beta x + alpha gram x in double, rounded once to bf16.
  std::vector<double> gram(static_cast<std::size_t>(m * m));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k)
        sum += values[static_cast<std::size_t>(i * n + k)] * values[static_cast<std::size_t>(j * n + k)];
      gram[static_cast<std::size_t>(i * m + j)] = static_cast<double>(bfloat16(static_cast<float>(sum)));
    }
  int64_t exact = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < m; ++k)
        sum += gram[static_cast<std::size_t>(i * m + k)] * values[static_cast<std::size_t>(k * n + j)];
      const double expected = static_cast<double>(
          bfloat16(static_cast<float>(beta * values[static_cast<std::size_t>(i * n + j)] + alpha * sum)));
      const double got = x.item(i * n + j);
      CHECK(got == static_cast<double>(bfloat16(static_cast<float>(got))));    // a bf16 value, held in f32
      CHECK(std::fabs(got - expected) <= 0x1p-7 * std::fabs(expected) + 1e-6); // an f32 sum's rounding apart at most
      exact += got == expected;
    }
  CHECK(exact >= m * n * 9 / 10); // and nearly always the same bf16 value
}

TEST_CASE("matrix products: shapes that do not fit, and pointwise ops on other shapes, are optjit::Errors") {
  GraphBuilder b("shapes", Dtype::f32);
  b.declare_slot({"x", SlotRole::Param, SlotKind::Tensor, Dtype::f32, {}});
  const ValueId x = b.tensor("x");
  const ValueId product = b.add(Node{Op::mm, Level::Element, Dtype::f32, {x, x}, 0, "nn f32"}); // m x n @ m x n
  b.store("x", product);
  const Graph inner = b.finish();
  const Tensor wide = Tensor::zeros({2, 3}, Dtype::f32);
  check_error_contains([&] { interpret(inner, arguments_for(wide, 0, 1)); }, "the inner sizes differ (3 and 2)");

  GraphBuilder g("gram_plus", Dtype::f32);
  g.declare_slot({"x", SlotRole::Param, SlotKind::Tensor, Dtype::f32, {}});
  const ValueId y = g.tensor("x");
  const ValueId gram = g.add(Node{Op::mm, Level::Element, Dtype::f32, {y, y}, 0, "nt f32"});
  g.store("x", g.binary(Op::add, gram, y));
  check_error_contains([&] { interpret(g.finish(), arguments_for(wide, 0, 1)); },
                       "pointwise ops take values of the param's shape");
}

TEST_CASE("matrix products: the planner runs them in the library between the kernels that write and read them") {
  const PipelineResult result = run_pipeline(iteration_graph("f32"));
  // Kernel 0 writes x out as the products' operand; the library computes x x^T, then beta x + alpha (x x^T) x; kernel
  // 1 loads that and stores it to x.
  REQUIRE(result.kernels.size() == 2);
  REQUIRE(result.kernels[0].calls_after.size() == 2);
  CHECK(result.kernels[1].calls_after.empty());
  CHECK(result.stats.library_calls == 2);
  const LibraryCall& gram = result.kernels[0].calls_after[0];
  const LibraryCall& next = result.kernels[0].calls_after[1];
  CHECK(gram.op == Op::mm);
  CHECK(gram.a == gram.b);
  CHECK(next.op == Op::addmm);
  CHECK(next.input == gram.a);
  CHECK(next.b == gram.a);
  CHECK(next.a == gram.result);
  CHECK(next.beta.hyper == "beta");
  CHECK(next.alpha.hyper == "alpha");
  REQUIRE(result.scratch.size() == 3);
  CHECK(result.scratch[1].shape == MatrixShape::MM); // x x^T of an (m, n) param
  CHECK(print_fused(result).find("then \"" + next.result + "\" = addmm \"nn f32\"") != std::string::npos);
  bool stores_operand = false;
  for (const Store& s : result.kernels[0].graph.stores)
    stores_operand = stores_operand || s.name == gram.a;
  CHECK(stores_operand);
}

TEST_CASE("matrix products: scratch buffers whose lives do not overlap share storage, never a call's operand") {
  const PipelineResult result = run_pipeline(iteration_graph("bf16", 5));
  REQUIRE(result.scratch.size() == 11); // the operand, and each iteration's two products
  std::map<std::string, const ScratchBuffer*> buffer;
  std::set<int> storages;
  for (const ScratchBuffer& s : result.scratch) {
    buffer[s.name] = &s;
    storages.insert(s.storage);
  }
  // Two iterates of x (m x n) and one Gram matrix (m x m) live at once: three storages for eleven buffers.
  CHECK(storages.size() == 3);
  for (const KernelPlan& k : result.kernels) {
    std::set<int> used;
    std::size_t declared = 0;
    for (const Slot& slot : k.graph.slots)
      if (slot.role == SlotRole::Scratch) {
        used.insert(buffer.at(slot.name)->storage);
        ++declared;
      }
    CHECK(used.size() == declared); // a kernel never stores one buffer over another it loads
    for (const LibraryCall& call : k.calls_after) {
      const int result_storage = buffer.at(call.result)->storage;
      CHECK(result_storage != buffer.at(call.a)->storage);
      CHECK(result_storage != buffer.at(call.b)->storage);
      if (!call.input.empty())
        CHECK(result_storage != buffer.at(call.input)->storage);
    }
  }
  for (const ScratchBuffer& s : result.scratch)
    for (const ScratchBuffer& t : result.scratch)
      if (s.storage == t.storage)
        CHECK((s.dtype == t.dtype && s.shape == t.shape));
  CHECK(print_fused(result).find("scratch \"product %") != std::string::npos);
}

TEST_CASE("matrix products: a compiled plan of kernels and library calls computes what the interpreter does") {
  for (const std::string dtype : {"f32", "bf16"}) {
    const int64_t m = 6, n = 10;
    std::vector<double> values;
    for (int64_t i = 0; i < m * n; ++i)
      values.push_back(std::cos(0.37 * static_cast<double>(i)));
    const Tensor interpreted = Tensor::from_values({m, n}, values, Dtype::f32), compiled = interpreted.clone();
    const Graph g = iteration_graph(dtype, 3); // buffers that share storage hand each iterate on
    interpret(g, arguments_for(interpreted, 1.0, -0.01));
    bool hit = false;
    const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
    std::unique_ptr<Executable> code = cpu_backend().load(run_pipeline(g), cpu, CompileOptions{}, hit);
    const ListArguments args = arguments_for(compiled, 1.0, -0.01);
    code->bind(args);
    code->set_hyper(args.hyper);
    code->launch();
    CHECK(compiled.to_vector() == interpreted.to_vector()); // the same products in the same library, rounded alike
    CHECK(compiled.to_vector() != values);
  }
}
