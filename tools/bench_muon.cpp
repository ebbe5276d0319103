// optjit bench's Muon rows: torch.optim.Muon's step compiled over the matrices of a Transformer (d_model 768, per
// layer the attention's in- and out-projections and the MLP's two matrices; f32 params), against what it is made
// of, each run alone in the same process: its matrix products in the same library (runtime/gemm.h), batched as the
// step batches them, and a traffic probe of its kernels' bytes. The bound is their sum, and the step's goal is 1.2x
// it. torch's own Muon and torch.compile of its step on the same shapes come from tools/bench_torch.py when a Python
// with torch is found.
#include "tools/bench_muon.h"
#include "compiler/compiled_step.h"
#include "compiler/pipeline.h"
#include "frontend/optim/registry.h"
#include "runtime/gemm.h"
#include "runtime/thread_pool.h"
#include "tools/bench_arrays.h"
#include "tools/commands.h"
#include "tools/model.h"
#include "tools/timing.h"
#include "tools/torch_anchors.h"
#include "tools/traffic_probe.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>

namespace optjit {
namespace {

using json = nlohmann::json;

constexpr int64_t kModel = 768;

std::vector<Shape> transformer_matrices(int layers) {
  std::vector<Shape> shapes;
  for (int layer = 0; layer < layers; ++layer)
    for (const Shape& s :
         {Shape{3 * kModel, kModel}, Shape{kModel, kModel}, Shape{4 * kModel, kModel}, Shape{kModel, 4 * kModel}})
      shapes.push_back(s);
  return shapes;
}

// The matrix products of `bucket`'s plan as its compiled step runs them: each call once per set of params of one
// shape and group (one batched product), with the group's coefficients.
std::vector<GemmShape> products_of(const Optimizer& opt, const ParamBucket& bucket) {
  const PipelineResult pipeline = run_pipeline(opt.trace_bucket(bucket));
  std::map<std::string, MatrixShape> scratch;
  for (const ScratchBuffer& s : pipeline.scratch)
    scratch[s.name] = s.shape;
  std::map<std::pair<int, Shape>, int64_t> batches; // (group, shape) -> params
  for (const BucketMember& m : bucket.members)
    ++batches[{m.group, opt.flat_param(m.flat).shape()}];
  std::vector<GemmShape> products;
  for (const KernelPlan& kernel : pipeline.kernels)
    for (const LibraryCall& call : kernel.calls_after)
      for (const auto& [key, count] : batches) {
        const auto& [group_index, shape] = key;
        const ParamGroup& group = opt.param_groups()[static_cast<std::size_t>(group_index)];
        const auto matrix = [&](const std::string& name) {
          const auto [rows, cols] = matrix_dims(scratch.at(name));
          const auto size = [&](char dim) { return dim == 'm' ? shape[0] : shape[1]; };
          return Shape{count, size(rows), size(cols)};
        };
        const auto value = [&](const LibraryCall::Scalar& s) {
          return s.hyper.empty() ? s.value : opt.hyper_value(group, s.hyper);
        };
        GemmShape product = gemm_shape(matrix_product_form(Node{call.op, Level::Element, Dtype::f32, {}, 0, call.form}),
                                       matrix(call.a), matrix(call.b));
        product.alpha = value(call.alpha);
        if (call.op == Op::addmm)
          product.beta = value(call.beta);
        products.push_back(product);
      }
  return products;
}

// Runs `products` one after another, as a step would, on buffers of their own (kept small values: sums stay finite).
class ProductsAlone {
public:
  explicit ProductsAlone(const std::vector<GemmShape>& products) {
    int64_t largest = 0;
    for (const GemmShape& p : products) {
      gemms_.push_back(&prepared_gemm(p));
      largest = std::max({largest, p.batch * p.m * p.k, p.batch * p.k * p.n, p.batch * p.m * p.n});
    }
    for (Tensor* t : {&a_, &b_, &c_})
      *t = Tensor::full({largest}, 1e-3, Dtype::f32); // wide enough for bf16 or f32 operands
  }
  void run() const {
    for (const Gemm* g : gemms_)
      g->run(a_.data(), b_.data(), c_.data());
  }

private:
  std::vector<const Gemm*> gemms_;
  Tensor a_, b_, c_;
};

} // namespace

json bench_muon(int layers, bool as_json) {
  ThreadPool& pool = ThreadPool::global();
  std::vector<Tensor> params = random_params(transformer_matrices(layers), Dtype::f32, 0);
  auto opt = make_optimizer("muon", {ParamGroupSpec{params, {}}}, {{"lr", {0.02}}});
  CompiledStep step = compile(*opt);
  const double first_ms = time_ms([&] { step(); });
  const double compile_ms = step.metrics().compile_ms;
  // Its parts alone: the products of every bucket, and a probe of every bucket's kernels' bytes.
  std::vector<GemmShape> products;
  std::vector<TrafficProbe> probes;
  int64_t pointwise_bytes = 0;
  for (const ParamBucket& bucket : opt->make_buckets()) {
    for (const GemmShape& p : products_of(*opt, bucket))
      products.push_back(p);
    std::vector<int64_t> numels;
    for (const BucketMember& m : bucket.members)
      numels.push_back(opt->flat_param(m.flat).numel());
    probes.emplace_back(numels, arrays_of(*opt, bucket));
    pointwise_bytes += probes.back().bytes_per_pass();
  }
  const ProductsAlone alone(products);
  const auto probe = [&] {
    for (TrafficProbe& p : probes)
      p.run();
  };
  for (int i = 0; i < 2; ++i) { // fault every page in
    step();
    alone.run();
    probe();
  }
  double ms = 0, gemm_ms = 0, probe_ms = 0;
  for (int half = 0; half < 2; ++half) { // interleaved, so drift in the machine's speed hits every side alike
    ms += median_ms(4, [&] { step(); }) / 2;
    gemm_ms += median_ms(4, [&] { alone.run(); }) / 2;
    probe_ms += median_ms(4, probe) / 2;
  }
  const double bound = gemm_ms + probe_ms;
  const std::string shape = std::to_string(params.size()) + " matrices (" + std::to_string(layers) + " layers, d 768)";
  if (!as_json) {
    std::printf("\nMuon (defaults, lr 0.02, f32) on a Transformer's matrices: %s, %d threads\n", shape.c_str(),
                pool.size());
    std::printf("  step %9.2f ms  = %.2fx (products alone %.2f ms + pointwise bytes %.1f MB at the probe's %.2f ms; "
                "goal <= 1.2x)\n",
                ms, ms / bound, gemm_ms, static_cast<double>(pointwise_bytes) / 1e6, probe_ms);
    std::printf("  %d kernels + %d library calls per step (%zu batched products), compile %.1f ms, first step %.0f "
                "ms\n",
                step.kernel_count(), step.library_call_count(), products.size(), compile_ms, first_ms);
  }
  json rows = json::array();
  rows.push_back({{"optimizer", "Muon"},
                  {"shape", shape},
                  {"threads", pool.size()},
                  {"ms", ms},
                  {"gemm_ms", gemm_ms},
                  {"probe_ms", probe_ms},
                  {"pointwise_bytes", pointwise_bytes},
                  {"ratio_to_bound", ms / bound},
                  {"goal", 1.2},
                  {"compile_ms", compile_ms},
                  {"first_step_ms", first_ms}});
  // torch's Muon and torch.compile of its step, on the same shapes and threads.
  const json torch =
      torch_anchors("--cpu-muon " + std::to_string(layers) + " --threads " + std::to_string(pool.size()));
  if (!torch.contains("muon_ms")) {
    if (!as_json)
      std::printf("  torch beside Muon skipped: %s\n", torch.value("skipped", "no result").c_str());
    return rows;
  }
  if (!as_json) {
    std::printf("  torch.optim.Muon %9.2f ms/step: optjit %.2fx its time\n", torch["muon_ms"].get<double>(),
                ms / torch["muon_ms"].get<double>());
    if (torch.contains("compiled_ms"))
      std::printf("  torch.compile(opt.step) %9.2f ms/step, first call %.0f ms: optjit %.2fx its time, compile %.1f "
                  "ms against %.0f ms\n",
                  torch["compiled_ms"].get<double>(), torch["compiled_first_ms"].get<double>(),
                  ms / torch["compiled_ms"].get<double>(), compile_ms, torch["compiled_first_ms"].get<double>());
  }
  for (const auto& [key, value] : torch.items())
    rows.push_back({{"metric", "torch_" + key}, {"shape", shape}, {"value", value}});
  return rows;
}

} // namespace optjit
