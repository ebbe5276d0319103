// The CUDA backend. Needing no GPU (so CI runs them): the PTX of every optimizer configuration assembles with
// ptxas for sm_80 and sm_90 without spills (skipped, with the reason logged, where ptxas is absent); the GPU's exp,
// log and pow against libm; eager steps refuse params on a GPU clearly. Needing a GPU (skipped with the reason
// otherwise): tensors round trip; every configuration compiled on the GPU against the CPU forloop; 10,000 small
// tensors; a tensor of more than 2^31 elements; None grads, replaced grads and state_dict on the GPU; CUDA graphs.
#include "codegen/codegen.h"
#include "compiler/compiled_step.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/sgd.h"
#include "runtime/cuda_driver.h"
#include "tools/count_configs.h"
#include "tools/model.h"

#include "helpers.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

using namespace optjit;
using namespace optjit::test;

namespace {

const char* kPtxas = "/usr/local/cuda/bin/ptxas";

// Runs `command`, returning its exit status and what it printed (stdout and stderr).
std::pair<int, std::string> run(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe);
  std::string out;
  char buffer[4096];
  while (std::size_t n = fread(buffer, 1, sizeof buffer, pipe))
    out.append(buffer, n);
  return {pclose(pipe), out};
}

bool skip_without_gpu() {
  if (cuda::available())
    return false;
  MESSAGE("skipped: no CUDA driver or GPU on this machine (GPU tests run where `optjit bench --device cuda` can)");
  return true;
}

std::vector<Tensor> on_device(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& p : params)
    out.push_back(p.to(device));
  return out;
}

// The CPU params' grads, copied to the GPU params (None stays None).
void copy_grads(const std::vector<Tensor>& from, const std::vector<Tensor>& to) {
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (from[i].grad().defined())
      to[i].set_grad(from[i].grad().to(to[i].device()));
    else
      to[i].reset_grad();
  }
}

// `steps` steps of `name` compiled on cuda:0 against the CPU forloop, with a None grad at step 2.
void check_gpu_against_forloop(const std::string& name, const KeywordOptions& options, Dtype dtype,
                               const std::vector<Shape>& shapes, int steps) {
  std::vector<Tensor> ref = random_params(shapes, dtype, 5);
  std::vector<Tensor> gpu = on_device(ref, Device::cuda(0));
  auto forloop = make_single_group(name, ref, options, false);
  auto compiled_opt = make_single_group(name, gpu, options, true);
  CompiledStep compiled = compile(*compiled_opt);
  for (int s = 0; s < steps; ++s) {
    for (Tensor& p : ref)
      p.set_grad(Tensor::zeros(p.shape(), dtype));
    randomize_grads(ref, 300 + static_cast<uint64_t>(s));
    if (s == 2 && ref.size() > 1)
      ref[1].reset_grad();
    copy_grads(ref, gpu);
    forloop->step();
    compiled();
  }
  // The GPU contracts a*b+c into fused multiply-adds; the CPU kernels and the forloop do not. bf16 and f16 values
  // that land near a rounding boundary may then round to neighbours: the golden low-precision bound (4 and 2 ulp).
  const double eps = dtype == Dtype::bf16 ? 0x1p-7 : 0x1p-10;
  const double rtol = dtype == Dtype::f32 ? 1e-5 : dtype == Dtype::f64 ? 1e-12 : 4 * eps;
  const double atol = dtype == Dtype::f32 ? 1e-6 : dtype == Dtype::f64 ? 1e-14 : 2 * eps;
  check_same_trajectory(gpu, *compiled_opt, ref, *forloop, rtol, atol, "cuda compiled vs cpu forloop");
  CHECK(compiled.metrics().compiles == 1);
  CHECK(compiled.metrics().recompiles == 0);
}

} // namespace

TEST_CASE("cuda ptx: every optimizer configuration assembles with ptxas for sm_80 and sm_90, without spills") {
  if (!std::filesystem::exists(kPtxas)) {
    MESSAGE("skipped: " << kPtxas << " is absent (install the CUDA toolkit's ptxas to run this check)");
    return;
  }
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "optjit_test_kernel.ptx";
  int assembled = 0;
  auto check_assembles = [&](Optimizer& opt, const std::string& what) {
    CompiledStep step = compile(opt);
    for (int sm : {80, 90}) {
      INFO(what << " sm_" << sm);
      const std::string ptx = step.dump(Stage::PTX, sm);
      CHECK(ptx.find(".target sm_" + std::to_string(sm)) != std::string::npos);
      std::ofstream(file) << ptx;
      auto [status, out] =
          run(std::string(kPtxas) + " -v --gpu-name sm_" + std::to_string(sm) + " " + file.string() + " -o /dev/null");
      CHECK_MESSAGE(status == 0, out);
      CHECK_MESSAGE(out.find("0 bytes spill stores, 0 bytes spill loads") != std::string::npos, out);
      CHECK_MESSAGE(out.find(" 0 bytes stack frame") != std::string::npos, out);
      ++assembled;
    }
  };
  std::vector<CountConfig> configs = torch_optim_configs();
  for (const CountConfig& c : own_optimizer_configs())
    configs.push_back(c);
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16, Dtype::f16})
    for (const CountConfig& c : configs) {
      auto opt = make_single_group(c.optimizer, random_params({{8}, {3}}, dtype, 1), c.options, true);
      check_assembles(*opt, c.optimizer + " " + config_name(c.options) + " " + std::string(dtype_name(dtype)));
    }
  for (const auto& [name, options] :
       optjit::test::every_optimizer()) // master weights (an f32 slot more), stochastic rounding
    for (const char* option : {"master_weights", "stochastic_rounding"}) {
      KeywordOptions with = options;
      with[option] = {1};
      auto opt = make_single_group(name, random_params({{8}, {3}}, Dtype::bf16, 1), with, true);
      check_assembles(*opt, name + " bf16 " + option);
    }
  std::filesystem::remove(file);
  CHECK(assembled >= 480 + 16 + 44);
}

TEST_CASE("cuda ptx: the GPU's exp, log and pow agree with libm to a few ulp, special values included") {
  const HostDeviceMath math = device_math_on_host();
  auto ulps = [](double got, double want) {
    if (std::isnan(want))
      return std::isnan(got) ? 0.0 : INFINITY;
    if (std::isinf(want) || want == 0)
      return got == want ? 0.0 : INFINITY;
    return std::fabs(got - want) / (std::nextafter(std::fabs(want), INFINITY) - std::fabs(want));
  };
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-740, 705), magnitude(-300, 300), small(-3, 3);
  double worst_exp = 0, worst_log = 0, worst_pow = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = exponent(rng);
    worst_exp = std::max(worst_exp, ulps(math.exp(x), std::exp(x)));
    const double y = std::pow(10.0, magnitude(rng));
    worst_log = std::max(worst_log, ulps(math.log(y), std::log(y)));
    // Optimizer-like powers: beta^step, and moderate bases and exponents.
    const double base = std::exp(small(rng)), power = small(rng) * 50;
    worst_pow = std::max(worst_pow, ulps(math.pow(base, power), std::pow(base, power)));
  }
  CHECK(worst_exp <= 2);
  CHECK(worst_log <= 2);
  CHECK(worst_pow <= 512); // exp(y log x) loses ~2 |y log x| ulps to log's rounding; |y log x| <= 150 here
  CHECK(ulps(math.pow(0.999, 10000), std::pow(0.999, 10000)) <= 64);
  for (double x : std::vector<double>{0.0, -0.0, 1.0, -1.0, INFINITY, -INFINITY, NAN, 1e-310, 5e-324, 710.0, -746.0})
    for (double (*f)(double) : {math.exp, math.log}) {
      INFO("x = " << x);
      CHECK(ulps(f(x), f == math.exp ? std::exp(x) : std::log(x)) <= 2);
    }
  for (auto [x, y] : std::vector<std::pair<double, double>>{
           {2, 0}, {1, NAN}, {-2, 3}, {-2, 2}, {-2, 0.5}, {0, 2}, {0, -1}, {INFINITY, 2}, {0.5, INFINITY}}) {
    INFO("pow(" << x << ", " << y << ")");
    CHECK(ulps(math.pow(x, y), std::pow(x, y)) <= 2);
  }
}

TEST_CASE("cuda: eager and forloop steps refuse params on a GPU with a clear error") {
  if (skip_without_gpu())
    return;
  std::vector<Tensor> params = on_device(random_params({{4}}, Dtype::f32, 1), Device::cuda(0));
  params[0].set_grad(Tensor::zeros({4}, Dtype::f32, Device::cuda(0)));
  auto opt = make_single_group("adam", params, {}, true);
  check_error_contains([&] { opt->step(); }, "compile the step (optjit::compile) to run it on the GPU");
}

TEST_CASE("cuda: tensors round trip between host and device") {
  if (skip_without_gpu())
    return;
  Tensor host = Tensor::from_values({2, 3}, std::vector<double>{1, 2, 3, 4, 5, 6}, Dtype::f32);
  Tensor device = host.to(Device::cuda(0));
  CHECK(device.device() == Device::cuda(0));
  CHECK(device.to(Device::cuda(0)).same(device));
  CHECK(device.to_vector() == host.to_vector());
  device.set_item(4, 50);
  CHECK(device.item(4) == 50);
  Tensor copy = device.clone();
  device.fill(2);
  CHECK(copy.to(Device::cpu()).to_vector() == std::vector<double>{1, 2, 3, 4, 50, 6});
  CHECK(Tensor::zeros({3}, Dtype::f64, Device::cuda(0)).to_vector() == std::vector<double>{0, 0, 0});
  CHECK(device.describe() == "f32[2, 3] on cuda:0");
}

TEST_CASE("cuda: every optimizer configuration compiled on the GPU matches the CPU forloop") {
  if (skip_without_gpu())
    return;
  std::vector<CountConfig> configs = torch_optim_configs();
  for (const CountConfig& c : own_optimizer_configs())
    configs.push_back(c);
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16, Dtype::f16})
    for (const CountConfig& c : configs) {
      INFO(c.optimizer << " " << config_name(c.options) << " " << dtype_name(dtype));
      // Sizes that leave vector remainders, a tensor of several work items and an empty one.
      check_gpu_against_forloop(c.optimizer, c.options, dtype, {{33, 7}, {5}, {70001}, {0}, {4, 4}}, 6);
    }
}

TEST_CASE("cuda: 10,000 small tensors in one launch") {
  if (skip_without_gpu())
    return;
  std::vector<Shape> shapes;
  std::mt19937 rng(3);
  for (int i = 0; i < 10000; ++i)
    shapes.push_back({static_cast<int64_t>(rng() % 300)});
  check_gpu_against_forloop("adam", {{"amsgrad", {1}}, {"weight_decay", {0.01}}}, Dtype::f32, shapes, 3);
}

TEST_CASE("cuda: a tensor of more than 2^31 elements (64-bit indexing)") {
  if (skip_without_gpu())
    return;
  const int64_t n = (int64_t{1} << 31) + 4099;
  Tensor param = Tensor::empty({n}, Dtype::f32), grad = Tensor::empty({n}, Dtype::f32);
  float* p = param.data_as<float>();
  float* g = grad.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(i % 1000) * 1e-3f;
    g[i] = static_cast<float>(i % 7) - 3.0f;
  }
  Tensor gpu_param = param.to(Device::cuda(0));
  gpu_param.set_grad(grad.to(Device::cuda(0)));
  grad = Tensor();
  SGD opt({gpu_param}, {.lr = 0.5});
  CompiledStep step = compile(opt);
  step();
  Tensor result = gpu_param.to(Device::cpu());
  const float* r = result.data_as<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float expected = p[i] - 0.5f * (static_cast<float>(i % 7) - 3.0f);
    wrong += r[i] != expected;
  }
  CHECK(wrong == 0);
  CHECK(r[n - 1] == p[n - 1] - 0.5f * (static_cast<float>((n - 1) % 7) - 3.0f));
}

TEST_CASE("cuda: replaced grads repoint, None grads rebind, state_dict round trips through the GPU") {
  if (skip_without_gpu())
    return;
  std::vector<Tensor> ref = random_params({{100}, {7, 3}}, Dtype::f32, 9);
  std::vector<Tensor> gpu = on_device(ref, Device::cuda(0));
  auto forloop = make_single_group("adam", ref, {{"amsgrad", {1}}}, false);
  auto opt = make_single_group("adam", gpu, {{"amsgrad", {1}}}, true);
  CompiledStep step = compile(*opt);
  for (int s = 0; s < 5; ++s) {
    for (Tensor& p : ref)
      p.set_grad(Tensor::zeros(p.shape(), Dtype::f32));
    randomize_grads(ref, 40 + static_cast<uint64_t>(s));
    if (s == 3)
      ref[0].reset_grad();
    copy_grads(ref, gpu); // new grad tensors every step
    forloop->step();
    step();
  }
  check_same_trajectory(gpu, *opt, ref, *forloop, 1e-5, 1e-6, "after replaced and None grads");
  CHECK(step.metrics().compiles == 1);
  const StateDict saved = opt->state_dict();
  auto resumed = make_single_group("adam", gpu, {{"amsgrad", {1}}}, true);
  resumed->load_state_dict(saved);
  for (std::size_t i = 0; i < gpu.size(); ++i)
    for (const auto& [key, t] : resumed->visible_state(gpu[i]))
      CHECK(t.device() == Device::cuda(0));
  check_same_trajectory(gpu, *resumed, ref, *forloop, 1e-5, 1e-6, "state_dict on the GPU");
}

TEST_CASE("cuda: CUDA graphs replay the step, with this step's hyperparameters, and re-capture on rebind") {
  if (skip_without_gpu())
    return;
  std::vector<Tensor> ref = random_params({{1000}, {33, 7}, {5}}, Dtype::f32, 11);
  std::vector<Tensor> gpu = on_device(ref, Device::cuda(0));
  auto forloop = make_single_group("adam", ref, {{"weight_decay", {0.01}}}, false);
  auto opt = make_single_group("adam", gpu, {{"weight_decay", {0.01}}}, true);
  CompileOptions options;
  options.cuda_graphs = true;
  CompiledStep step = compile(*opt, options);
  for (int s = 0; s < 12; ++s) {
    for (Tensor& p : ref)
      p.set_grad(Tensor::zeros(p.shape(), Dtype::f32));
    randomize_grads(ref, 70 + static_cast<uint64_t>(s));
    if (s == 6)
      ref[1].reset_grad(); // a rebind: the graphs are captured again
    copy_grads(ref, gpu);  // new grad tensors every step: repointed, the graphs stay
    for (auto* o : {forloop.get(), opt.get()})
      o->param_groups()[0].set("lr", 1e-3 * (1 + s)); // every step's lr reaches the replayed graph
    forloop->step();
    step();
  }
  check_same_trajectory(gpu, *opt, ref, *forloop, 1e-5, 1e-6, "cuda graphs vs cpu forloop");
  const StepMetrics& m = step.metrics();
  CHECK(m.compiles == 1);
  // A graph per staging slot (4) as the slots come round: steps 0-5 capture 4, step 6 (None grad, rebound) 1,
  // steps 7-11 (the grad back, rebound) 4.
  CHECK(m.graph_captures == 9);
}

TEST_CASE("cuda: stochastic rounding draws the same bits on the GPU as on the CPU") {
  if (skip_without_gpu())
    return;
  // SGD with lr 1 from 1.0 by 0.325 of a bf16 ulp: exact in f32 on both targets, so every rounding is the draw's.
  constexpr double kD = 1.0 / 512 + 1.0 / 2048;
  std::vector<Tensor> results;
  for (Device device : {Device::cpu(), Device::cuda(0)}) {
    std::vector<Tensor> params = {Tensor::full({70001}, 1.0, Dtype::bf16, device)};
    params[0].set_grad(Tensor::full({70001}, -kD, Dtype::bf16, device));
    auto opt = make_optimizer("sgd", {ParamGroupSpec{params, {}}},
                              {{"lr", {1}}, {"stochastic_rounding", {1}}, {"foreach", {1}}});
    opt->set_stochastic_rounding(11);
    CompiledStep step = compile(*opt);
    step();
    results.push_back(params[0].to(Device::cpu()));
  }
  CHECK(results[0].to_vector() == results[1].to_vector());
}
