// StepRecording, what a Python step function records into: a step recorded op by op with torch's names and
// replayed into each bucket's tracer equals the same step written with the foreach vocabulary bit for bit; a value is
// recorded once; torch's lowerings (pow by a number, >=, !=, norms over the lists from their sums of squares); what
// each value holds per tensor, and the messages for values that do not fit, sizes a param lacks, ops outside the
// vocabulary and values kept from a closed recording.
#include "frontend/optim/step_function.h"
#include "frontend/trace/step_recording.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_error_contains;

namespace {

// Signed momentum: m = beta m + (1 - beta) g; p -= lr sign(m), in the foreach vocabulary.
void signum_function(Tracer& t) {
  Sym m = t.tensors("momentum_buffer") * t.hyper("beta") + t.tensors("grad") * (1.0 - t.hyper("beta"));
  t.store("momentum_buffer", m);
  t.store("param", foreach_add(t.tensors("param"), sign(m), -t.hyper("lr")));
}

// The same step as a Python step function records it: torch._foreach_mul(bufs, beta), ..., by torch's op names.
StepRecording signum_recording() {
  StepRecording r("signum", 2, 2);
  r.open();
  const int params = r.list("param", Holds::Element), grads = r.list("grad", Holds::Element);
  const int buffers = r.list("momentum_buffer", Holds::Element);
  const int lr = r.hyper("lr"), beta = r.hyper("beta");
  const int decayed = r.op("mul", {buffers, beta});
  const int m = r.op("add", {decayed, r.op("mul", {grads, r.op("sub", {r.constant(1.0), beta})})});
  r.store("momentum_buffer", m);
  r.store("param", r.op("sub_scaled", {params, r.op("sign", {m}), lr}));
  r.close();
  return r;
}

struct Lists {
  std::vector<Tensor> params, buffers;
  StepLists step_lists() const {
    return {.params = params, .state = {{"momentum_buffer", buffers}}, .hypers = {{"lr", 0.01}, {"beta", 0.9}}};
  }
};

Lists signum_lists() {
  Lists lists;
  lists.params = random_params({{5, 7}, {3, 4}}, Dtype::f32, 3);
  const std::vector<Tensor> grads = random_params({{5, 7}, {3, 4}}, Dtype::f32, 4);
  for (std::size_t k = 0; k < lists.params.size(); ++k) {
    lists.params[k].set_grad(grads[k]);
    lists.buffers.push_back(random_params({lists.params[k].shape()}, Dtype::f32, 10 + k)[0]);
  }
  return lists;
}

} // namespace

TEST_CASE("step recording: a recorded step replays into the tracer as the foreach vocabulary writes it") {
  const StepRecording recording = signum_recording();
  Lists recorded = signum_lists(), written = signum_lists();
  StepFunction replayed = compile_step(
      "signum", [&](Tracer& t) { recording.replay(t); }, recorded.step_lists());
  StepFunction direct = compile_step("signum", signum_function, written.step_lists());
  for (int step = 0; step < 3; ++step) {
    replayed();
    direct();
  }
  for (std::size_t k = 0; k < recorded.params.size(); ++k) {
    CHECK(recorded.params[k].to_vector() == written.params[k].to_vector());
    CHECK(recorded.buffers[k].to_vector() == written.buffers[k].to_vector());
  }
  CHECK(replayed.kernel_count() == 1);
  CHECK(recording.stored_slots() == std::vector<std::string>{"momentum_buffer", "param"});
  CHECK_FALSE(recording.reduces());
}

TEST_CASE("step recording: a value is recorded once, stores every time, and torch's ops lower as torch computes") {
  StepRecording r("lowered", 3, 2);
  r.open();
  const int x = r.list("param", Holds::Element), y = r.list("grad", Holds::Element);
  CHECK(r.op("mul", {x, y}) == r.op("mul", {x, y})); // a loop over zip(params, grads) records each op once
  CHECK(r.constant(0.0) != r.constant(-0.0));        // numbers by their bits
  CHECK(r.constant(std::nan("")) == r.constant(-std::numeric_limits<double>::quiet_NaN())); // but a NaN is a NaN
  CHECK(r.pow_number(x, 0.5) == r.op("sqrt", {x})); // sqrt(-0.0) is -0.0, as torch's pow(x, 0.5) gives
  CHECK(r.pow_number(x, -1) == r.op("reciprocal", {x}));
  CHECK(r.pow_number(x, 2) == r.op("mul", {x, x}));
  CHECK(r.op("ge", {x, y}) == r.op("add", {r.op("gt", {x, y}), r.op("eq", {x, y})}));
  CHECK(r.op("ne", {x, y}) == r.op("sub", {r.constant(1.0), r.op("eq", {x, y})}));
  // The 2-norm over the lists of per-tensor 2-norms is taken from their sums of squares: one pass, not two.
  const int norm = r.reduce(y, "norm", 2.0, std::nullopt, "", false);
  const int total = r.reduce_stack(norm, "norm", 2.0);
  const auto listing = r.instructions();
  const auto& [op, inputs, name, number, holds] = listing[static_cast<std::size_t>(total)];
  CHECK(op == "sqrt");
  CHECK(std::get<0>(listing[static_cast<std::size_t>(inputs[0])]) == "list_sum");
  CHECK(std::get<0>(listing[static_cast<std::size_t>(std::get<1>(listing[static_cast<std::size_t>(inputs[0])])[0])]) ==
        "sum");
  r.store("param", x);
  r.store("param", x);
  CHECK(r.instructions().size() == listing.size() + 2);
  CHECK(r.reduces());
  r.close();
}

TEST_CASE("step recording: what values hold per tensor, and the values a tensor cannot take") {
  StepRecording r("factored", 1, 2);
  r.open();
  const int g = r.list("grad", Holds::Element), row_state = r.list("exp_avg_sq_row", Holds::Rows);
  const int col_state = r.list("exp_avg_sq_col", Holds::Cols);
  const int row_mean = r.reduce(g, "mean", std::nullopt, -1, "-1", true);
  CHECK(r.holds(row_mean) == Holds::Rows);
  CHECK(r.holds(r.reduce(row_mean, "sum", std::nullopt, -2, "-2", true)) == Holds::Matrix);
  CHECK(r.holds(r.matmul(row_state, col_state)) == Holds::Element);
  CHECK(r.holds(r.op("add", {row_state, col_state})) == Holds::Element); // broadcast as torch's shapes do
  CHECK(r.holds(r.reduce(g, "max", std::nullopt, std::nullopt, "", false)) == Holds::Tensor);
  CHECK(r.written(row_mean, row_state, Holds::Rows) == row_mean);
  const int zero = r.constant(0.0);
  CHECK(r.written(zero, row_state, Holds::Rows) == r.op("where", {row_state, zero, zero})); // zero_() keeps the shape
  check_error([&] { r.written(g, row_state, Holds::Rows); },
              "a step function writes a value of one per element into a tensor of one per row: its shape does not "
              "fit, as torch's in-place ops refuse");
  check_error_contains([&] { r.matmul(col_state, row_state); },
                       "the operator @ on elements: optjit records the product of two element values");
  check_error_contains([&] { r.matmul(std::nullopt, col_state); }, "the operator @ on elements");
  check_error_contains([&] { r.reduce(row_state, "sum", std::nullopt, std::nullopt, "", false); },
                       "sum over a whole tensor of one value per row");
  check_error_contains([&] { r.reduce(g, "sum", std::nullopt, 0, "(0, 1)", true); }, "sum along dim=(0, 1)");
  check_error_contains([&] { r.reduce(g, "mean", std::nullopt, -1, "-1", false); },
                       "mean along dim -1 without keepdim=True");
  check_error([&] { r.reduce(g, "norm", 1.0, std::nullopt, "", false); },
              "norm of order 1: optjit records the 2-norm and the inf-norm");
  check_error_contains([&] { r.size(r.hyper("lr"), -1); }, "the size of a 0-d element");
  check_error_contains([&] { r.size(g, 0); }, "size(0): optjit records size(-1), size(-2) and numel()");
  check_error_contains([&] { r.size(g, 0, "'a'"); }, "size('a'): optjit records size(-1)");
  check_error_contains([&] { r.op("erf", {g}); }, "torch.erf is outside optjit's step-function vocabulary");
  check_error_contains([&] { r.reduce(1000, "sum", std::nullopt, std::nullopt, "", false); },
                       "step function factored uses a value it did not record (value 1000)");
  check_error_contains([&] { r.store("exp_avg_sq_row", -1); }, "uses a value it did not record");
  check_error([&] { r.store("exp_avg", g); },
              "step function factored stores to list 'exp_avg', which is not one of its lists");
  r.close();

  StepRecording vector("vector_step", 1, 1);
  vector.open();
  check_error([&] { vector.size(vector.list("param", Holds::Element), -2); },
              "size(-2) of an element of a list with a param of rank 1: it has no such dimension (torch raises)");
  vector.close();
}

TEST_CASE("step recording: a value kept from a closed recording is refused naming both step functions") {
  StepRecording first("first", 1, 1);
  first.open();
  const int lr = first.hyper("lr");
  CHECK(first.describe(first.op("mul", {lr, first.hyper("beta")})) ==
        "a value computed from the hyperparameters beta, lr");
  CHECK(first.describe(lr) == "the value of the hyperparameter lr");
  first.close();
  StepRecording second("second", 1, 1);
  second.open();
  check_error_contains([&] { first.op("neg", {lr}); },
                       "step function second uses a value recorded by an earlier call of step function first");
  second.close();
  check_error_contains([&] { first.check_open(); }, "step function first uses a value recorded by an earlier call");
}

namespace {

// torch.optim.Muon's single-tensor step as a step function over wide matrices records it: the iterations on
// x.bfloat16() with torch.mm, .T and torch.addmm, each op in torch's dtype (lerp, norm, clamp, div: bf16 rounds).
StepRecording muon_recording(int steps) {
  StepRecording r("muon", 2, 2);
  r.open();
  const int params = r.list("param", Holds::Element), grads = r.list("grad", Holds::Element);
  const int buffers = r.list("momentum_buffer", Holds::Element);
  const int lr = r.hyper("lr"), momentum = r.hyper("momentum"), one = r.constant(1.0);
  const int buffer = r.op("lerp", {buffers, grads, r.op("sub", {one, momentum})});
  r.store("momentum_buffer", buffer);
  int x = r.to_bf16(r.op("lerp", {grads, buffer, momentum}));
  CHECK(r.is_bf16(x));
  const int norm = r.reduce(x, "linalg_vector_norm", 2.0, std::nullopt, "", false);
  CHECK(r.is_bf16(norm)); // a bf16 tensor's norm is a bf16 0-d tensor
  x = r.op("div", {x, r.clamp(norm, r.hyper("eps"), std::nullopt)});
  for (int step = 0; step < steps; ++step) {
    const int gram = r.matmul(x, r.transpose(x));
    const int polynomial = r.addmm(gram, gram, gram, r.hyper("ns_b"), r.hyper("ns_c"));
    x = r.addmm(x, polynomial, x, r.hyper("ns_a"), one);
  }
  const int decayed = r.op("mul", {params, r.op("sub", {one, r.op("mul", {lr, r.hyper("weight_decay")})})});
  const int ratio = r.op("div", {r.size(params, -2), r.size(params, -1)});
  const int adjusted = r.op("mul", {lr, r.pow_number(r.clamp(ratio, one, std::nullopt), 0.5)});
  const int update = r.op("sub_scaled", {decayed, x, adjusted});
  CHECK_FALSE(r.is_bf16(update)); // the param's dtype: a bf16 update added to an f32 tensor
  r.store("param", update);
  r.close();
  return r;
}

} // namespace

TEST_CASE("step recording: Muon written with torch.mm, .T, addmm and .bfloat16() is the built-in Muon's plan") {
  const StepRecording recording = muon_recording(5);
  const std::vector<Shape> shapes = {{4, 9}, {6, 6}};
  std::vector<Tensor> recorded = random_params(shapes, Dtype::f32, 5), builtin = copy_params(recorded);
  std::vector<Tensor> buffers;
  for (const Shape& s : shapes)
    buffers.push_back(Tensor::full(s, 0.0, Dtype::f32));
  StepFunction replayed = compile_step("muon", [&](Tracer& t) { recording.replay(t); },
                                       {.params = recorded,
                                        .state = {{"momentum_buffer", buffers}},
                                        .hypers = {{"lr", 0.02},
                                                   {"momentum", 0.95},
                                                   {"weight_decay", 0.1},
                                                   {"eps", 1e-7},
                                                   {"ns_a", 3.4445},
                                                   {"ns_b", -4.7750},
                                                   {"ns_c", 2.0315}}});
  auto muon = make_optimizer("Muon", {ParamGroupSpec{builtin, {}}}, {{"lr", {0.02}}});
  for (int step = 0; step < 3; ++step) {
    randomize_grads(recorded, 20 + static_cast<uint64_t>(step));
    for (std::size_t k = 0; k < builtin.size(); ++k)
      builtin[k].set_grad(recorded[k].grad().clone());
    replayed();
    muon->step(); // its forloop step: torch's algorithm with the same products
  }
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    INFO("param " << k);
    CHECK(test::scaled_error(recorded[k], builtin[k], 1e-6, 1e-7) <= 1);
    CHECK(buffers[k].to_vector() ==
          find_state(muon->visible_state(builtin[k]), "momentum_buffer").to_vector()); // exact, as torch's
  }
  CHECK(replayed.kernel_count() == 3); // the norm, the momentum and operand, the update
  CHECK(replayed.library_call_count() == 15);
}

TEST_CASE("step recording: products, transposes and bf16 values that do not fit are refused as torch would") {
  StepRecording r("products", 1, 2);
  r.open();
  const int g = r.list("grad", Holds::Element), rows = r.list("row_state", Holds::Rows), lr = r.hyper("lr");
  const int x = r.to_bf16(g);
  CHECK(r.to_bf16(x) == x);
  CHECK(r.is_bf16(r.op("mul", {x, lr})));       // a Python number does not promote
  CHECK_FALSE(r.is_bf16(r.op("add", {x, g})));  // an f32 tensor does
  CHECK_FALSE(r.is_bf16(r.op("gt", {x, lr})));  // a comparison is a bool tensor
  CHECK_FALSE(r.is_bf16(r.to_list_dtype(x)));   // x.float()
  CHECK(r.transpose(r.transpose(x)) == x);      // (x.T).T
  const int gram = r.matmul(x, r.transpose(x)); // (m, m)
  check_error_contains([&] { r.op("add", {gram, gram}); }, "torch.add on a matrix product's value of shape (m, m)");
  check_error_contains([&] { r.matmul(x, x); }, "the inner sizes n and m differ unless the param is square");
  check_error_contains([&] { r.matmul(x, r.transpose(g)); }, "expected both operands to have the same dtype");
  check_error_contains([&] { r.op("mul", {r.transpose(x), lr}); }, "a transposed element (x.T, x.mT) is used by");
  check_error_contains([&] { r.addmm(x, x, r.transpose(x), lr, lr); },
                       "torch.addmm adds a matrix of shape (m, n) to a product of shape (m, m)");
  check_error_contains([&] { r.addmm(gram, gram, gram, g, lr); }, "beta and alpha are numbers");
  check_error_contains([&] { r.matmul(rows, x); }, "the operator @ on elements");
  check_error_contains([&] { r.store("grad", gram); }, "of shape (m, m)");
  check_error_contains([&] { r.transpose(rows); }, "x.T of a value of one per row");
  StepRecording vectors("vectors", 1, 1); // lists with a 1-D param
  vectors.open();
  const int v = vectors.list("grad", Holds::Element);
  check_error_contains([&] { vectors.matmul(v, v); }, "a list with a param of rank 1: optjit multiplies the matrices");
}
