// Steps over shards (CompileOptions::shard_reducer): each of two "processes" (threads here, with an all-reduce that
// waits for both, as a collective does) holds rows of every tensor, as FSDP2 splits them, and steps its rows. A
// global norm, an inf norm and per-tensor norms must come out as the whole tensors' would: each process's shards,
// stepped, equal the rows of the whole tensors stepped in one process, compiled and eager, for a step function and for
// the built-in LAMB (with fused clipping too, whose grad norm goes through the reducer). A step that reads a tensor's
// size or its rows or columns is refused, and a step without reductions never calls the reducer.
#include "frontend/optim/lamb.h"
#include "frontend/optim/step_function.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <barrier>
#include <functional>
#include <thread>

using namespace optjit;
using optjit::test::check_error_contains;

namespace {

constexpr int kWorld = 2;

// Rows [r * chunk, (r + 1) * chunk) of the tensor for process r, chunk = ceil(rows / kWorld), as FSDP2's Shard(0)
// (the last process's part may be short or empty).
Tensor shard_of(const Tensor& whole, int r) {
  const int64_t rows = whole.shape().empty() ? 1 : whole.shape()[0];
  const int64_t chunk = (rows + kWorld - 1) / kWorld;
  const int64_t begin = std::min(rows, r * chunk), end = std::min(rows, (r + 1) * chunk);
  const int64_t row_size = rows == 0 ? 0 : whole.numel() / rows;
  const std::vector<double> values = whole.to_vector();
  Shape shape = whole.shape();
  shape[0] = end - begin;
  return Tensor::from_values(shape, std::span(values).subspan(begin * row_size, (end - begin) * row_size),
                             whole.dtype());
}

// Gives each of `whole` random grads (seeded by `seed` and its size), then returns each process's shards of the
// params, with their shards of the grads.
std::vector<std::vector<Tensor>> shards_in_every_process(std::vector<Tensor>& whole, uint64_t seed) {
  for (Tensor& p : whole)
    p.set_grad(random_params({p.shape()}, p.dtype(), seed + static_cast<uint64_t>(p.numel()))[0]);
  std::vector<std::vector<Tensor>> shards(kWorld);
  for (int r = 0; r < kWorld; ++r)
    for (const Tensor& t : whole) {
      shards[static_cast<std::size_t>(r)].push_back(shard_of(t, r));
      shards[static_cast<std::size_t>(r)].back().set_grad(shard_of(t.grad(), r));
    }
  return shards;
}

// An all-reduce between kWorld threads: each deposits its values and waits for the others; every thread then
// combines them in process order. Counts the calls, and notes any call whose sizes or kinds differ between threads.
class ThreadAllReduce {
public:
  void reduce(int rank, std::vector<double>& values, ShardCombine how) {
    deposited_[rank] = {values, how};
    arrived_.arrive_and_wait();
    bool mismatch = false;
    for (int r = 0; r < kWorld; ++r)
      mismatch = mismatch || deposited_[r].second != how || deposited_[r].first.size() != values.size();
    if (!mismatch)
      for (std::size_t k = 0; k < values.size(); ++k) {
        double total = deposited_[0].first[k];
        for (int r = 1; r < kWorld; ++r)
          total = how == ShardCombine::Sum ? total + deposited_[r].first[k] : std::max(total, deposited_[r].first[k]);
        values[k] = total;
      }
    if (rank == 0) {
      ++calls_;
      mismatches_ += mismatch;
    }
    combined_.arrive_and_wait(); // nobody deposits again before every thread has read
  }
  int calls() const { return calls_; }
  int mismatches() const { return mismatches_; }
  std::function<void(std::vector<double>&, ShardCombine)> for_rank(int rank) {
    return [this, rank](std::vector<double>& values, ShardCombine how) { reduce(rank, values, how); };
  }

private:
  std::pair<std::vector<double>, ShardCombine> deposited_[kWorld];
  std::barrier<> arrived_{kWorld}, combined_{kWorld};
  int calls_ = 0, mismatches_ = 0;
};

// Runs `body(rank)` in kWorld threads at once; rethrows the first error.
void in_every_process(const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads)
    t.join();
  for (const std::exception_ptr& e : errors)
    if (e)
      std::rethrow_exception(e);
}

// Clipping by the global 2-norm, scaled by the global inf-norm and by each tensor's trust ratio (LAMB's per-tensor
// norms): every kind of reduction that spans the shards.
void normalized_function(Tracer& t) {
  const Sym p = t.tensors("param"), g = t.tensors("grad");
  const Sym total = sqrt(list_sum(sum(g * g)));
  const Sym clip = minimum(t.hyper("max_norm") / (total + 1e-6), t.constant(1.0));
  const Sym peak = list_max(max_of(abs(g)));
  const Sym trust = foreach_norm(p) / (foreach_norm(g) + 1e-6);
  t.store("param", p - g * (t.hyper("lr") * clip * trust / (peak + 1.0)));
}

// Each process's shards equal the rows of the whole tensors stepped in one process.
void check_shards_match(const std::vector<std::vector<Tensor>>& shards, const std::vector<Tensor>& whole) {
  for (std::size_t i = 0; i < whole.size(); ++i) {
    std::vector<double> joined;
    for (const std::vector<Tensor>& process : shards)
      for (double v : process[i].to_vector())
        joined.push_back(v);
    const std::vector<double> expected = whole[i].to_vector();
    REQUIRE(joined.size() == expected.size());
    for (std::size_t k = 0; k < expected.size(); ++k)
      CHECK(joined[k] == doctest::Approx(expected[k]).epsilon(1e-6));
  }
}

} // namespace

TEST_CASE("shard reductions: norms over shards in two processes are the whole tensors' norms") {
  for (const Execution execution : {Execution::Compiled, Execution::Interpreted}) {
    INFO(std::string(execution == Execution::Compiled ? "compiled" : "interpreted"));
    // A 1-element param: the second process's shard of it is empty. An f64 param makes a second bucket.
    std::vector<Tensor> whole = random_params({{9, 6}, {5}, {1}}, Dtype::f32, 3);
    whole.push_back(random_params({{4, 3}}, Dtype::f64, 4)[0]);
    const std::vector<std::vector<Tensor>> shards = shards_in_every_process(whole, 7);
    const std::map<std::string, double> hypers = {{"lr", 0.1}, {"max_norm", 0.5}};

    StepFunction reference =
        compile_step("normalized", normalized_function, {.params = whole, .hypers = hypers}, {.execution = execution});
    ThreadAllReduce all_reduce;
    std::vector<int> kernels(kWorld);
    in_every_process([&](int r) {
      StepFunction step = compile_step("normalized", normalized_function,
                                       {.params = shards[static_cast<std::size_t>(r)], .hypers = hypers},
                                       {.execution = execution, .shard_reducer = all_reduce.for_rank(r)});
      for (int s = 0; s < 3; ++s)
        step();
      kernels[static_cast<std::size_t>(r)] = step.kernel_count();
    });
    for (int s = 0; s < 3; ++s)
      reference();
    check_shards_match(shards, whole);
    CHECK(all_reduce.mismatches() == 0);
    CHECK(kernels[0] == reference.kernel_count());
    CHECK(kernels[1] == reference.kernel_count());
    // Compiled: one pause per step, the first kernel's, with a call for its sums and one for its maxima; eager: a
    // pause and a call per reduction (the grads' sum of squares, their largest |g|, the params' sum of squares).
    CHECK(all_reduce.calls() == 3 * (execution == Execution::Compiled ? 2 : 3));
  }
}

TEST_CASE("shard reductions: the built-in LAMB over shards steps as over whole tensors, clipped too") {
  for (const bool clipped : {false, true}) {
    INFO(std::string(clipped ? "clipped" : "not clipped"));
    std::vector<Tensor> whole = random_params({{8, 5}, {7}, {1}}, Dtype::f32, 11);
    const std::vector<std::vector<Tensor>> shards = shards_in_every_process(whole, 13);
    const LAMBOptions options{.lr = 0.01, .weight_decay = 0.1};
    const std::optional<Optimizer::GradClipping> clipping =
        clipped ? std::optional(Optimizer::GradClipping{.max_norm = 0.1}) : std::nullopt;
    LAMB reference(whole, options);
    reference.set_grad_clipping(clipping);
    CompiledStep reference_step = compile(reference);
    ThreadAllReduce all_reduce;
    std::vector<double> norms(kWorld);
    in_every_process([&](int r) {
      LAMB lamb(shards[static_cast<std::size_t>(r)], options);
      lamb.set_grad_clipping(clipping);
      CompiledStep step = compile(lamb, {.shard_reducer = all_reduce.for_rank(r)});
      for (int s = 0; s < 3; ++s)
        step();
      norms[static_cast<std::size_t>(r)] = lamb.total_grad_norm();
    });
    for (int s = 0; s < 3; ++s)
      reference_step();
    check_shards_match(shards, whole);
    CHECK(all_reduce.mismatches() == 0);
    // Per step: the grad pass's norm (clipped), then the norms' pass, one sum of both norms' partials.
    CHECK(all_reduce.calls() == 3 * (clipped ? 2 : 1));
    if (clipped) {
      CHECK(reference.total_grad_norm() > 0.1);                                      // clipping was active
      CHECK(norms[0] == doctest::Approx(reference.total_grad_norm()).epsilon(1e-6)); // f32 grads: f32 norms
      CHECK(norms[1] == norms[0]);
    }
  }
}

TEST_CASE("shard reductions: an optimizer with a grad norm reducer of its own is refused, not combined twice") {
  std::vector<Tensor> params = random_params({{4, 3}}, Dtype::f32, 2);
  params[0].set_grad(Tensor::full({4, 3}, 1.0, Dtype::f32));
  const std::vector<double> before = params[0].to_vector();
  LAMB lamb(params, LAMBOptions{});
  lamb.set_grad_clipping(Optimizer::GradClipping{.max_norm = 1.0});
  lamb.set_grad_norm_reducer([](double partial, bool) { return partial; });
  CompiledStep step = compile(lamb, {.shard_reducer = [](std::vector<double>&, ShardCombine) {}});
  check_error_contains([&] { step(); }, "the optimizer has its own grad norm or inf check reducer too");
  CHECK(params[0].to_vector() == before);
}

TEST_CASE(
    "shard reductions: sizes, rows, columns and products span the shards and are refused, no reduction calls nothing") {
  std::vector<Tensor> params = random_params({{6, 4}}, Dtype::f32, 5);
  const std::vector<double> before = params[0].to_vector();
  for (Tensor& p : params)
    p.set_grad(Tensor::full(p.shape(), 0.5, Dtype::f32));
  int calls = 0;
  const CompileOptions over_shards{.shard_reducer = [&](std::vector<double>&, ShardCombine) { ++calls; }};
  StepFunction mean = compile_step(
      "mean_scaled",
      [](Tracer& t) {
        t.store("param", t.tensors("param") - t.tensors("grad") * (sum(t.tensors("grad")) / t.numel()));
      },
      {.params = params}, over_shards);
  check_error_contains(
      [&] { mean(); },
      "mean_scaled: a step over shards (each process steps its part of every tensor, as under FSDP2) combines its sums "
      "and maxima over the processes, but a tensor's size (numel, size(-1), size(-2)) spans the shards too");
  std::vector<Tensor> rows = {Tensor::zeros({6, 1}, Dtype::f32)};
  StepFunction row_means = compile_step(
      "row_means", [](Tracer& t) { t.store("rows", row_mean(t.tensors("grad"))); },
      {.params = params, .rows = {{"rows", rows}}}, over_shards);
  check_error_contains([&] { row_means(); }, "but 'rows', a rows state, spans the shards too");
  StepFunction gram = compile_step(
      "gram",
      [](Tracer& t) {
        t.store("param", mm(mm(t.tensors("grad"), t.tensors("grad"), false, true, Dtype::f32), t.tensors("param"),
                            false, false, Dtype::f32));
      },
      {.params = params}, over_shards);
  check_error_contains([&] { gram(); }, "but a matrix product (mm: it multiplies whole matrices");
  StepFunction plain = compile_step(
      "plain_sgd", [](Tracer& t) { t.store("param", t.tensors("param") - t.tensors("grad") * t.hyper("lr")); },
      {.params = params, .hypers = {{"lr", 0.1}}}, over_shards);
  plain();
  CHECK(calls == 0);
  const std::vector<double> after = params[0].to_vector();
  for (std::size_t k = 0; k < before.size(); ++k)
    CHECK(after[k] == doctest::Approx(before[k] - 0.05));
}
