// The IR: builder rules, printer/parser round trip, verifier, interpreter semantics.
#include "frontend/optim/registry.h"
#include "helpers.h"
#include "ir/arguments.h"
#include "ir/builder.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/log.h"
#include "tools/model.h"

#include <doctest/doctest.h>

using namespace optjit;
using optjit::test::check_error_contains;

namespace {

// A builder for graph @name whose element math runs in `dtype`, over state tensor slots `names` and scalar slot
// "step".
GraphBuilder builder_with_slots(const std::string& name, Dtype dtype, const std::vector<std::string>& names) {
  GraphBuilder b(name, dtype);
  for (const std::string& slot : names)
    b.declare_slot({slot, SlotRole::State, SlotKind::Tensor, dtype, {}});
  b.declare_slot({"step", SlotRole::State, SlotKind::Scalar, dtype, {}});
  return b;
}

} // namespace

TEST_CASE("ir: the builder interns identical nodes and sorts commutative operands") {
  GraphBuilder b = builder_with_slots("g", Dtype::f32, {"x", "y"});
  ValueId x = b.tensor("x"), y = b.tensor("y");
  CHECK(b.tensor("x") == x);
  ValueId xy = b.binary(Op::mul, x, y);
  CHECK(b.binary(Op::mul, y, x) == xy); // commutative: same node
  CHECK(b.binary(Op::sub, x, y) != b.binary(Op::sub, y, x));
  CHECK(b.constant(2.0) == b.constant(2.0));
  CHECK(b.constant(0.0) != b.constant(-0.0)); // distinct bit patterns stay distinct
}

TEST_CASE("ir: a per-tensor scalar meeting an element value is rounded to the element dtype") {
  GraphBuilder b = builder_with_slots("g", Dtype::f32, {"x"});
  ValueId x = b.tensor("x");
  ValueId h = b.hyper("lr");
  CHECK(b.node(h).level == Level::PerTensor);
  CHECK(b.node(h).dtype == Dtype::f64);
  ValueId m = b.binary(Op::mul, h, x);
  const Node& mul = b.node(m);
  CHECK(mul.level == Level::Element);
  CHECK(mul.dtype == Dtype::f32);
  bool has_cast = false;
  for (ValueId in : mul.inputs)
    has_cast |= b.node(in).op == Op::cast && b.node(in).dtype == Dtype::f32;
  CHECK(has_cast);
}

TEST_CASE("ir: the builder rejects ill-formed stores with the rule broken") {
  GraphBuilder b = builder_with_slots("g", Dtype::f32, {"x"});
  ValueId x = b.tensor("x");
  ValueId one = b.constant(1);
  check_error_contains([&] { b.store_scalar("step", x); }, "per-tensor");
  check_error_contains([&] { b.store("x", one); }, "element");
  check_error_contains([&] { b.store("step", x); }, "uses slot 'step' as a tensor slot, but it is a scalar slot");
  check_error_contains([&] { b.store("y", x); }, "uses slot 'y', which graph @g does not declare");
  check_error_contains([&] { b.tensor("z"); }, "uses slot 'z', which graph @g does not declare");
  check_error_contains(
      [&] {
        b.declare_slot({"x", SlotRole::State, SlotKind::Tensor, Dtype::f32, {}});
      },
      "declares slot 'x' twice");
  b.store("x", x);
  check_error_contains([&] { b.store("x", x); }, "x");
}

TEST_CASE("ir: every traced optimizer graph prints, parses back and prints the same") {
  struct Config {
    const char* optimizer;
    KeywordOptions options;
  };
  const Config configs[] = {{"adam", {}},
                            {"adam", {{"amsgrad", {1}}, {"weight_decay", {0.1}}, {"maximize", {1}}}},
                            {"adamw", {{"amsgrad", {1}}}},
                            {"sgd", {}},
                            {"sgd", {{"momentum", {0.9}}, {"nesterov", {1}}, {"weight_decay", {0.1}}}},
                            {"sgd", {{"momentum", {0.9}}, {"dampening", {0.3}}, {"maximize", {1}}}}};
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16})
    for (const Config& c : configs) {
      auto opt = make_optimizer(c.optimizer, {ParamGroupSpec{random_params({{3}, {2, 2}}, dtype, 1), {}}}, c.options);
      opt->ensure_state();
      for (const auto& bucket : opt->make_buckets()) {
        Graph g = opt->trace_bucket(bucket);
        verify(g);
        const std::string text = print_graph(g);
        INFO(text);
        Graph parsed = parse_graph(text);
        verify(parsed);
        CHECK(print_graph(parsed) == text);
        CHECK(parsed == g);
      }
    }
}

TEST_CASE("ir: numbers print in the shortest form that parses back exactly") {
  for (double v : {0.1, 1e-8, -0.0, 0.999, 1.0 / 3.0, 1e300, 5e-324, 123456789.0})
    CHECK(std::strtod(format_number(v).c_str(), nullptr) == v);
  CHECK(format_number(1e-8) == "1e-08");
  CHECK(format_number(0.5) == "0.5");
  CHECK(format_number(-0.0) == "-0");
}

TEST_CASE("ir: parse errors name the line and the problem") {
  check_error_contains([] { parse_graph("graph @g f32 {\n  %0 = frobnicate : pt f64\n}\n"); }, "line 2");
  check_error_contains(
      [] {
        parse_graph(
            "graph @g f32 {\n  slot \"x\" : state tensor f32\n  %0 = tensor \"x\" : el f32\n  %1 = add %0, %7 : el "
            "f32\n}\n");
      },
      "line 4");
  check_error_contains(
      [] { parse_graph("graph @g f32 {\n  slot \"x\" : state tensor f32\n  %0 = tensor \"x\" : el f32\n"); }, "}");
  check_error_contains([] { parse_graph("graph @g f32 {\n  %0 = tensor \"x\" : el f32\n}\n"); },
                       "line 2: node tensor uses slot 'x', which graph @g does not declare");
  check_error_contains([] { parse_graph("graph @g f32 {\n  slot \"x\" : weight tensor f32\n}\n"); },
                       "slot role must be param, grad, state or scratch, got 'weight'");
  // The name becomes the kernels' symbols: LLVM aborts on "sg+" in PTX (found by fuzz_ir).
  check_error_contains(
      [] { parse_graph("graph @sg+ f32 {\n}\n"); },
      "graph @sg+: a graph's name is an identifier (letters, digits and _, not starting with a digit)");
}

TEST_CASE("ir: the verifier rejects a node whose recorded type is not the builder's") {
  GraphBuilder b = builder_with_slots("g", Dtype::f32, {"x"});
  ValueId x = b.tensor("x");
  b.store("x", b.unary(Op::sqrt, x));
  Graph g = b.finish();
  verify(g);
  Graph bad = g;
  bad.nodes[1].level = Level::PerTensor;
  check_error_contains([&] { verify(bad); }, "invalid graph @g at %1");
  Graph forward = g;
  forward.nodes[1].inputs = {5};
  check_error_contains([&] { verify(forward); }, "invalid graph @g at %1");
}

TEST_CASE("ir: the interpreter gives every load the value from before the step") {
  // y <- x, x <- y: a swap, because stores happen after every value is computed.
  GraphBuilder b = builder_with_slots("swap", Dtype::f64, {"x", "y"});
  ValueId x = b.tensor("x"), y = b.tensor("y");
  b.store("x", y);
  b.store("y", x);
  Graph g = b.finish();
  Tensor tx = Tensor::from_values({2}, std::vector<double>{1, 2}, Dtype::f64);
  Tensor ty = Tensor::from_values({2}, std::vector<double>{3, 4}, Dtype::f64);
  ListArguments args;
  args.slot_names = {"x", "y"};
  args.slot_tensors = {{tx}, {ty}};
  args.group_of = {0};
  interpret(g, args);
  CHECK(tx.to_vector() == std::vector<double>{3, 4});
  CHECK(ty.to_vector() == std::vector<double>{1, 2});
}

TEST_CASE("ir: maximum and minimum propagate NaN and order -0 below +0, as torch") {
  GraphBuilder b = builder_with_slots("mm", Dtype::f64, {"x", "y", "max", "min"});
  ValueId x = b.tensor("x"), y = b.tensor("y");
  b.store("max", b.binary(Op::maximum, x, y));
  b.store("min", b.binary(Op::minimum, x, y));
  Graph g = b.finish();
  const double nan = std::nan("");
  Tensor tx = Tensor::from_values({3}, std::vector<double>{nan, -0.0, 1}, Dtype::f64);
  Tensor ty = Tensor::from_values({3}, std::vector<double>{1, 0.0, 2}, Dtype::f64);
  Tensor tmax = Tensor::zeros({3}, Dtype::f64), tmin = Tensor::zeros({3}, Dtype::f64);
  ListArguments args;
  args.slot_names = {"x", "y", "max", "min"};
  args.slot_tensors = {{tx}, {ty}, {tmax}, {tmin}};
  args.group_of = {0};
  interpret(g, args);
  CHECK(std::isnan(tmax.item(0)));
  CHECK(std::isnan(tmin.item(0)));
  CHECK_FALSE(std::signbit(tmax.item(1)));
  CHECK(std::signbit(tmin.item(1)));
  CHECK(tmax.item(2) == 2);
  CHECK(tmin.item(2) == 1);
}

TEST_CASE("log: OPTJIT_LOG switches named categories, or all of them") {
  setenv("OPTJIT_LOG", "recompiles,guards", 1);
  reload_log_settings();
  CHECK(log_enabled(LogCategory::recompiles));
  CHECK(log_enabled(LogCategory::guards));
  CHECK_FALSE(log_enabled(LogCategory::kernels));
  CHECK_FALSE(log_enabled(LogCategory::passes));
  setenv("OPTJIT_LOG", "all", 1);
  reload_log_settings();
  CHECK(log_enabled(LogCategory::codegen));
  CHECK(log_enabled(LogCategory::passes));
  unsetenv("OPTJIT_LOG");
  reload_log_settings();
  CHECK_FALSE(log_enabled(LogCategory::recompiles));
}
