// The tracer records an algorithm over the slots it declares, by role; a slot it does not declare is an error that
// names the ones it does, and a stored scalar reads back rounded to its slot's storage dtype.
#include "frontend/trace/foreach.h"
#include "ir/printer.h"

#include "helpers.h"

using namespace optjit;
using optjit::test::check_error_contains;

namespace {

std::vector<Slot> sgd_slots(Dtype dtype) {
  return {{"param", SlotRole::Param, SlotKind::Tensor, dtype},
          {"grad", SlotRole::Grad, SlotKind::Tensor, dtype},
          {"step", SlotRole::State, SlotKind::Scalar, dtype}};
}

} // namespace

TEST_CASE("tracer: an algorithm reads and writes only the slots it declares, found by role") {
  Tracer t("sgd", Dtype::f32, sgd_slots(Dtype::f32));
  Sym p = t.tensors("param"), g = t.tensors("grad");
  t.store("param", foreach_add(p, g, t.hyper("lr") * -1.0));
  check_error_contains([&] { t.tensors("momentum_buffer"); },
                       "uses slot 'momentum_buffer', which graph @sgd does not declare");
  check_error_contains([&] { t.store("exp_avg", p); }, "uses slot 'exp_avg', which graph @sgd does not declare");
  const Graph graph = t.finish();
  REQUIRE(graph.slots.size() == 3);
  CHECK(graph.slots[1].role == SlotRole::Grad);
  CHECK(print_graph(graph).find("  slot \"grad\" : grad tensor f32\n") != std::string::npos);
}

TEST_CASE("tracer: a stored scalar reads back rounded to its slot's storage dtype") {
  Tracer t("count", Dtype::f32, sgd_slots(Dtype::f32));
  Sym third = t.constant(1.0) / t.constant(3.0);
  Sym stored = t.store_scalar("step", third);
  const Graph graph = t.finish();
  const Node& read_back = graph.node(stored.id());
  CHECK(read_back.op == Op::cast);
  CHECK(read_back.dtype == Dtype::f64);
  CHECK(graph.node(read_back.inputs[0]).dtype == Dtype::f32); // rounded through f32, the slot's storage
}
