// What a compiled step on a GPU asks of the driver on the host, counted with a fake driver whose one device is host
// memory (tests/runtime/fake_cuda/host_memory_cuda.cpp: launches are counted, not run): how many launches a step
// queues, and that a pointwise step never makes the host wait for the device (no stream, context or event
// synchronization, no copy back), so the host can queue the next forward pass while the step runs. Each case loads
// that driver as the process's (OPTJIT_CUDA_LIBRARY), so it runs alone in its process, as ctest runs it.
#include "compiler/compiled_step.h"
#include "frontend/optim/options.h"
#include "helpers.h"
#include "runtime/cuda/cuda_driver.h"
#include "skip.h"
#include "tools/count_configs.h"
#include "tools/model.h"

#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstdlib>

using namespace optjit;

namespace {

struct DriverCounts {
  long launches = 0, host_waits = 0, device_to_host_copies = 0;
};

// Makes the counting driver the process's; false (the case skipped) when another driver was loaded first.
bool use_counting_driver() {
  setenv("OPTJIT_CUDA_LIBRARY", OPTJIT_TEST_HOST_MEMORY_CUDA, 1);
  if (!cuda::available() || cuda::properties(0).name != "host-memory fake GPU") {
    test::skip_test("another CUDA driver was loaded before this case: run it alone (ctest does)");
    return false;
  }
  return true;
}

// The counts since the last call (which zeroes them).
DriverCounts take_counts() {
  void* library = dlopen(OPTJIT_TEST_HOST_MEMORY_CUDA, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(library);
  using CountsFunction = void (*)(long*, long*, long*, int);
  void* symbol = dlsym(library, "optjit_fake_cuda_counts");
  REQUIRE(symbol);
  auto counts = reinterpret_cast<CountsFunction>(symbol);
  DriverCounts c;
  counts(&c.launches, &c.host_waits, &c.device_to_host_copies, 1);
  dlclose(library);
  return c;
}

// Params of `shapes` on the fake GPU, each with a grad there.
std::vector<Tensor> gpu_params(const std::vector<Shape>& shapes, Dtype dtype) {
  std::vector<Tensor> host = random_params(shapes, dtype, 3), params;
  for (Tensor& p : host)
    p.set_grad(Tensor::zeros(p.shape(), dtype));
  randomize_grads(host, 4);
  for (const Tensor& p : host) {
    params.push_back(p.to(Device::cuda(0)));
    params.back().set_grad(p.grad().to(Device::cuda(0)));
  }
  return params;
}

} // namespace

TEST_CASE("host waits: a compiled pointwise step on a GPU queues one launch per bucket and never waits for the "
          "device") {
  if (!use_counting_driver())
    return;
  const std::vector<Shape> shapes = {{1000}, {33, 7}, {5}, {16, 256}}; // the last in 8 bits too
  const std::vector<std::pair<std::string, KeywordOptions>> cases = {
      {"adam", {}},
      {"adamw", {{"amsgrad", {1}}}},
      {"sgd", {{"momentum", {0.9}}, {"nesterov", {1}}}},
      {"lion", {}},
      {"adamw", {{"state_dtype", {named_option_value("state_dtype", "int8")}}}}};
  for (const auto& [name, options] : cases) {
    CAPTURE(name);
    CAPTURE(config_name(options));
    auto opt = test::make_single_group(name, gpu_params(shapes, Dtype::f32), options, true);
    CompiledStep step = compile(*opt);
    step(); // compiles, and makes the state
    (void)take_counts();
    for (int s = 0; s < 12; ++s) // more steps than the pinned ring of host scalar uploads has buffers
      step();
    const DriverCounts counts = take_counts();
    CHECK(counts.launches == 12 * step.kernel_count());
    CHECK(counts.host_waits == 0);
    CHECK(counts.device_to_host_copies == 0);
  }
}

TEST_CASE("host waits: hyperparameters in tensors on the GPU (lr, beta1, GradScaler's scale and found_inf) are read "
          "there by the kernels, never copied back, and a scheduler's change in place recompiles nothing") {
  if (!use_counting_driver())
    return;
  auto opt = make_optimizer("adam",
                            {ParamGroupSpec{gpu_params({{1000}, {33, 7}}, Dtype::f32), {}},
                             ParamGroupSpec{gpu_params({{5}, {16, 256}}, Dtype::f32), {}}},
                            {{"foreach", {1}}, {"weight_decay", {0.01}}});
  Tensor lr = Tensor::from_values({}, std::vector<double>{1e-3}, Dtype::f32).to(Device::cuda(0));
  Tensor beta1 = Tensor::from_values({}, std::vector<double>{0.8}, Dtype::f64).to(Device::cuda(0));
  opt->param_groups()[0].set("lr", lr); // group 1 keeps a number: its kernels read it from a cell of the table
  opt->param_groups()[1].set("beta1", beta1);
  // GradScaler's scale and found_inf on the device, the skip decided by the kernels (as torch's fused kernels).
  opt->set_grad_scaling(Tensor::from_values({}, std::vector<double>{1024}, Dtype::f32).to(Device::cuda(0)),
                        Tensor::zeros({}, Dtype::f32).to(Device::cuda(0)), Optimizer::GradsAfterStep::Unscaled,
                        Optimizer::InfCheck::InKernels);
  CompiledStep step = compile(*opt);
  step();
  const std::string fused = step.dump(Stage::Fused);
  CHECK(fused.find("lr (f32 on device)") != std::string::npos);
  CHECK(fused.find("beta1 (f64 on device)") != std::string::npos);
  CHECK(fused.find("grad_scale (f32 on device)") != std::string::npos);
  CHECK(fused.find("found_inf (f32 on device)") != std::string::npos);
  DriverCounts counts;
  for (int s = 0; s < 12; ++s) {
    lr.fill(1e-3 * (12 - s) / 12); // an LR scheduler's update in place (this test's copy, not counted)
    (void)take_counts();
    step();
    const DriverCounts one = take_counts();
    counts.launches += one.launches;
    counts.host_waits += one.host_waits;
    counts.device_to_host_copies += one.device_to_host_copies;
  }
  CHECK(counts.launches == 12 * step.kernel_count());
  CHECK(counts.host_waits == 0);
  CHECK(counts.device_to_host_copies == 0);
  CHECK(step.metrics().compiles == 1);
}

TEST_CASE("host waits: a clipping step on a GPU combines its grad norm on the device, where the update reads the clip "
          "coefficient, and copies the norm back only when asked") {
  if (!use_counting_driver())
    return;
  // Two buckets (f32 with weight decay, bf16 without), each grad pass's contributions combined by one more kernel.
  auto opt = make_optimizer("adamw",
                            {ParamGroupSpec{gpu_params({{1000}, {33, 7}}, Dtype::f32), {}},
                             ParamGroupSpec{gpu_params({{5}, {16, 256}}, Dtype::bf16), {{"weight_decay", {0.0}}}}},
                            {{"foreach", {1}}});
  opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, false});
  CompiledStep step = compile(*opt);
  step();
  CHECK(step.dump(Stage::Fused).find("clip_coef (f64 on device)") != std::string::npos);
  CHECK(step.kernel_count() == 2 * 2 + 1); // per bucket its grad pass and its update, then the grad total
  (void)take_counts();
  for (int s = 0; s < 12; ++s)
    step();
  DriverCounts counts = take_counts();
  CHECK(counts.launches == 12 * step.kernel_count());
  CHECK(counts.host_waits == 0);
  CHECK(counts.device_to_host_copies == 0);
  (void)opt->total_grad_norm(); // asked for: one copy back
  CHECK(take_counts().device_to_host_copies == 1);
  // error_if_nonfinite needs the norm on the host: another program combines it there, a copy back per step.
  opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, true});
  step();
  counts = take_counts();
  CHECK(counts.device_to_host_copies > 0);
  CHECK(counts.launches == 4);
  CHECK(step.metrics().compiles == 2);
  // And back: the first program again, from the guard cache, with its norm on the device.
  opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, false});
  step();
  counts = take_counts();
  CHECK(counts.device_to_host_copies == 0);
  CHECK(counts.launches == 5);
  CHECK(step.metrics().compiles == 2);
}

TEST_CASE("host waits: GradScaler's in-step inf check on a GPU, with and without clipping, is decided on the device: "
          "the grad total writes found_inf there and the update's kernels skip on it") {
  if (!use_counting_driver())
    return;
  for (bool clips : {true, false}) {
    CAPTURE(clips);
    auto opt = make_optimizer("adam", {ParamGroupSpec{gpu_params({{1000}, {33, 7}}, Dtype::f32), {}}}, {});
    if (clips)
      opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, false});
    // scaler.step(opt) with a patched optimizer: the step checks its grads itself and fills a found_inf of its own.
    const Tensor found_inf = Tensor::zeros({}, Dtype::f32).to(Device::cuda(0));
    opt->set_grad_scaling(Tensor::from_values({}, std::vector<double>{1024}, Dtype::f32).to(Device::cuda(0)), found_inf,
                          Optimizer::GradsAfterStep::Unscaled, Optimizer::InfCheck::InStep);
    CompiledStep step = compile(*opt);
    step();
    const std::string fused = step.dump(Stage::Fused);
    CHECK(fused.find("found_inf (f32 on device)") != std::string::npos);
    CHECK((fused.find("clip_coef (f64 on device)") != std::string::npos) == clips);
    CHECK(step.kernel_count() == 3); // the grad pass, the grad total, the update
    (void)take_counts();
    for (int s = 0; s < 12; ++s)
      step();
    const DriverCounts counts = take_counts();
    CHECK(counts.launches == 12 * step.kernel_count());
    CHECK(counts.host_waits == 0);
    CHECK(counts.device_to_host_copies == 0);
    CHECK(step.metrics().compiles == 1);
  }
}
