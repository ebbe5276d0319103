// Scalar state held on the host (torch's steps that are not capturable, on a GPU): the host updates it before the
// kernels run, and the kernels read a copy of the values from before the update. Run here with the CPU kernels and
// a host copy, so every part but the device upload is checked without a GPU: the trajectory equals the ordinary
// compiled one bit for bit (a kernel that read the updated values would bias-correct with the next step's count).
#include "compiler/backend.h"
#include "compiler/backends/host_scalar_state.h"
#include "compiler/pipeline.h"
#include "helpers.h"
#include "ir/parser.h"

#include <doctest/doctest.h>

using namespace optjit;

namespace {

// Optimizer `opt`'s buckets, compiled for the CPU and run with their scalar state as host state.
struct HostStateRun {
  struct Bucket {
    ParamBucket bucket;
    std::unique_ptr<Executable> code;
  };
  std::vector<Bucket> buckets;

  explicit HostStateRun(Optimizer& opt) {
    opt.ensure_state();
    const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
    for (auto& [bucket, graph] : opt.describe().buckets) {
      PipelineResult pipeline = run_pipeline(std::move(graph));
      bool hit = false;
      buckets.push_back({bucket, with_scalar_state_on_host(cpu_backend().load(pipeline, cpu, CompileOptions{}, hit),
                                                           pipeline.optimized, Device::cpu())});
    }
  }
  void step(const Optimizer& opt) {
    for (Bucket& b : buckets) {
      b.code->bind(opt.list_arguments(b.bucket));
      b.code->set_hyper(opt.hyper_values({}));
      b.code->launch();
    }
  }
};

} // namespace

TEST_CASE("host scalar state: every optimizer's step equals the compiled one bit for bit") {
  for (const auto& [name, options] : test::every_optimizer()) {
    INFO(name);
    const std::vector<Tensor> initial = random_params(two_linear_shapes(), Dtype::f32, 5);
    test::Run ref(name, options, initial, test::Mode::Compiled);
    std::vector<Tensor> params = copy_params(initial);
    std::unique_ptr<Optimizer> opt = test::make_single_group(name, params, options, true);
    HostStateRun run(*opt);
    for (int s = 0; s < 4; ++s) {
      randomize_grads(ref.params, 70 + static_cast<uint64_t>(s));
      randomize_grads(params, 70 + static_cast<uint64_t>(s));
      ref.step();
      run.step(*opt);
    }
    test::check_same_trajectory(params, *opt, ref.params, *ref.opt, 0, 0, name);
  }
}

TEST_CASE("host scalar state: the host's graph is the step count's update alone, shown once bound") {
  std::vector<Tensor> params = random_params(two_linear_shapes(), Dtype::f32, 5);
  randomize_grads(params, 3);
  std::unique_ptr<Optimizer> opt = test::make_single_group("adam", params, {{"lr", {0.01}}}, true);
  HostStateRun run(*opt);
  CHECK(run.buckets.front().code->host_graph() == nullptr); // which slots the host holds is known at bind
  run.step(*opt);
  const Graph* host = run.buckets.front().code->host_graph();
  REQUIRE(host != nullptr);
  REQUIRE(host->stores.size() == 1);
  CHECK(host->stores[0].name == "step");
  for (ValueId id = 0; id < host->size(); ++id) // dce kept only what the count needs: no tensor data
    CHECK(host->node(id).level != Level::Element);
}

TEST_CASE("host scalar state: state computed from tensor data cannot be held on the host") {
  const Graph g = parse_graph(R"(graph @peak f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "peak" : state scalar f32
  %0 = tensor "grad" : el f32
  %1 = abs %0 : el f32
  %2 = reduce_max %1 : pt f64
  %3 = scalar_state "peak" : pt f64
  %4 = maximum %2, %3 : pt f64
  store_scalar "peak" %4
}
)");
  CHECK_THROWS_WITH_AS(run_host_scalar_state_pipeline(g, {"peak"}),
                       doctest::Contains("scalar state 'peak' is computed from tensor data (%2 = reduce_max)"), Error);
  CHECK(run_host_scalar_state_pipeline(g, {}).stores.empty()); // on the device, it is the kernels' to update
}

TEST_CASE("host scalar state: a host slot computed from a device slot is refused, the other way round is not") {
  // step (held on the host, as torch keeps it) and mu_product (moved to the device by torch's load_state_dict).
  const Graph g = parse_graph(R"(graph @nadam_like f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "step" : state scalar f32
  slot "mu_product" : state scalar f32
  %0 = scalar_state "step" : pt f64
  %1 = constant 1 : pt f64
  %2 = add %0, %1 : pt f64
  %3 = scalar_state "mu_product" : pt f64
  %4 = mul %3, %2 : pt f64
  %5 = tensor "param" : el f32
  store "param" %5
  store_scalar "step" %2
  store_scalar "mu_product" %4
}
)");
  // mu_product's update (on the device) reads step: step alone is the host's.
  CHECK(run_host_scalar_state_pipeline(g, {"step"}).stores.size() == 1);
  CHECK_THROWS_WITH_AS(run_host_scalar_state_pipeline(g, {"mu_product"}),
                       doctest::Contains("scalar state 'mu_product', held on the host, is computed from scalar state "
                                         "'step', which is on the params' device"),
                       Error);
}
