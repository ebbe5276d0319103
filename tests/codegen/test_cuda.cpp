// The CUDA backend. Needing no GPU (so CI runs them): the PTX of every optimizer configuration assembles with
// ptxas for sm_80 and sm_90 without spills, but for a few in axis kernels under their register cap (skipped, with the
// reason logged, where ptxas is absent); the GPU's exp, log and pow against libm; eager steps refuse params on a GPU
// clearly. Needing a GPU (skipped with the reason otherwise): tensors round trip; every configuration compiled on the
// GPU against the CPU forloop; 10,000 small tensors; a tensor of more than 2^31 elements; None grads, replaced grads
// and state_dict on the GPU; CUDA graphs.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/compiled_step.h"
#include "compiler/pipeline.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/sgd.h"
#include "frontend/optim/step_function.h"
#include "helpers.h"
#include "ir/parser.h"
#include "runtime/cuda/cuda_driver.h"
#include "tools/count_configs.h"
#include "tools/model.h"

#include "helpers.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

using namespace optjit;
using namespace optjit::test;

namespace {

const char* kPtxas = "/usr/local/cuda/bin/ptxas";

// The spill stores ptxas -v reports for a kernel ("N bytes spill stores"); -1 if it reports none.
long spill_store_bytes(const std::string& ptxas_output) {
  const std::size_t at = ptxas_output.find(" bytes spill stores");
  if (at == std::string::npos)
    return -1;
  std::size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(ptxas_output[begin - 1])))
    --begin;
  return std::stol(ptxas_output.substr(begin, at - begin));
}

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
  skip_test("no CUDA driver or GPU on this machine (GPU tests run where `optjit bench --device cuda` can)");
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

// `steps` steps of `name` compiled on cuda:0 against the CPU forloop, with a None grad at step 2. `products_atol`:
// how far apart products that round differently may leave the params (two libraries' bf16 products sum in
// different orders). Returns the compiled step's library calls per step.
int check_gpu_against_forloop(const std::string& name, const KeywordOptions& options, Dtype dtype,
                              const std::vector<Shape>& shapes, int steps, double clip_norm_type = 0,
                              double products_atol = 0) {
  std::vector<Tensor> ref = random_params(shapes, dtype, 5);
  std::vector<Tensor> gpu = on_device(ref, Device::cuda(0));
  auto forloop = make_single_group(name, ref, options, false);
  auto compiled_opt = make_single_group(name, gpu, options, true);
  if (clip_norm_type != 0)
    for (Optimizer* opt : {forloop.get(), compiled_opt.get()})
      opt->set_grad_clipping(Optimizer::GradClipping{1.0, clip_norm_type, false});
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
  const double atol = std::max(products_atol, dtype == Dtype::f32 ? 1e-6 : dtype == Dtype::f64 ? 1e-14 : 2 * eps);
  check_same_trajectory(gpu, *compiled_opt, ref, *forloop, rtol, atol, "cuda compiled vs cpu forloop");
  CHECK(compiled.metrics().compiles == 1);
  CHECK(compiled.metrics().recompiles == 0);
  return compiled.library_call_count();
}

} // namespace

TEST_CASE("cuda ptx: every optimizer configuration assembles with ptxas for sm_80 and sm_90, without spills but in "
          "axis kernels") {
  if (!std::filesystem::exists(kPtxas)) {
    skip_test(std::string(kPtxas) + " is absent (install the CUDA toolkit's ptxas to run this check)");
    return;
  }
  const std::filesystem::path file = test::temp_path("kernel.ptx");
  int assembled = 0, capped = 0;
  auto check_assembles = [&](Optimizer& opt, const std::string& what) {
    CompiledStep step = compile(opt);
    for (int sm : {80, 90}) {
      INFO(what << " sm_" << sm);
      const std::string ptx = step.dump(Stage::PTX, sm);
      CHECK(ptx.find(".target sm_" + std::to_string(sm)) != std::string::npos);
      // A plan of several kernels (a reduction's pass, then the next) dumps one module per kernel.
      const std::string header = "//\n// Generated by LLVM NVPTX Back-End";
      for (std::size_t at = ptx.find(header); at != std::string::npos;) {
        const std::size_t next = ptx.find(header, at + header.size());
        std::ofstream(file) << ptx.substr(at, next == std::string::npos ? std::string::npos : next - at);
        auto [status, out] = run(std::string(kPtxas) + " -v --gpu-name sm_" + std::to_string(sm) + " " + file.string() +
                                 " -o /dev/null");
        CHECK_MESSAGE(status == 0, out);
        const std::string kernel = ptx.substr(at, next == std::string::npos ? std::string::npos : next - at);
        if (kernel.find(".maxnreg 64") == std::string::npos) {
          CHECK_MESSAGE(out.find("0 bytes spill stores, 0 bytes spill loads") != std::string::npos, out);
          CHECK_MESSAGE(out.find(" 0 bytes stack frame") != std::string::npos, out);
        } else { // an axis kernel, capped at 64 registers on purpose (kGpuAxisMaxRegisters): a few spills, no more
          CHECK_MESSAGE(spill_store_bytes(out) <= 512, out);
          ++capped;
        }
        at = next;
      }
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
  // Muon's kernels (its scratch matrices, between library calls), with bf16 and f32 iterations: one bucket of wide
  // matrices (a tall one's kernels are the same with the dimensions swapped; ptxas takes seconds per kernel).
  for (const auto& [dtype, f32_iterations] :
       {std::pair{Dtype::f32, 0.0}, std::pair{Dtype::bf16, 0.0}, std::pair{Dtype::f32, 1.0}}) {
    auto opt =
        make_single_group("muon", random_params({{3, 5}}, dtype, 1), {{"f32_iterations", {f32_iterations}}}, true);
    check_assembles(*opt, "muon " + std::string(dtype_name(dtype)) + (f32_iterations != 0 ? " f32 iterations" : ""));
  }
  for (const auto& [name, options] :
       optjit::test::every_optimizer()) // master weights (an f32 slot more), stochastic rounding
    for (const char* option : {"master_weights", "stochastic_rounding"}) {
      KeywordOptions with = options;
      with[option] = {1};
      auto opt = make_single_group(name, random_params({{8}, {3}}, Dtype::bf16, 1), with, true);
      check_assembles(*opt, name + " bf16 " + option);
    }
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16}) // reductions: LAMB's norms, a clipping step's norm pass
    for (const CountConfig& c : reducing_configs()) {
      // Adafactor factors its matrices (rows and columns: items of whole rows) and not its vectors: one of each.
      const std::vector<Shape> shapes =
          c.optimizer == "adafactor" ? std::vector<Shape>{{8, 6}} : std::vector<Shape>{{8}, {3}};
      auto opt = make_single_group(c.optimizer, random_params(shapes, dtype, 1), c.options, true);
      if (c.clip_norm_type != 0)
        opt->set_grad_clipping(Optimizer::GradClipping{1.0, c.clip_norm_type, false});
      check_assembles(*opt, c.optimizer + " " + config_name(c.options) + " clip " + std::to_string(c.clip_norm_type) +
                                " " + std::string(dtype_name(dtype)));
      if (c.clip_norm_type != 0) { // the grad pass with the in-step inf check too
        opt->set_grad_scaling(Tensor::full({1}, 8, Dtype::f32), Tensor::zeros({1}, Dtype::f32),
                              Optimizer::GradsAfterStep::Unscaled, Optimizer::InfCheck::InStep);
        check_assembles(*opt, c.optimizer + " clip and inf check " + std::string(dtype_name(dtype)));
      }
    }
  std::filesystem::remove(file);
  CHECK(assembled >= 480 + 16 + 44 + 60);
  CHECK(capped > 0); // Adafactor's axis kernels
}

// SGD clipped by the global 2-norm, written with a list reduction (list_sum): the norms' pass, the host's combine,
// then the update.
const char* kGlobalClip = R"(graph @clip f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  %0 = hyper "lr" : pt f64
  %1 = constant 1e-06 : pt f64
  %2 = constant 1 : pt f64
  %3 = tensor "param" : el f32
  %4 = tensor "grad" : el f32
  %5 = mul %4, %4 : el f32
  %6 = reduce_sum %5 : pt f64
  %7 = list_sum %6 : pt f64
  %8 = sqrt %7 : pt f64
  %9 = add %8, %1 : pt f64
  %10 = div %2, %9 : pt f64
  %11 = minimum %10, %2 : pt f64
  %12 = mul %0, %11 : pt f64
  %13 = cast %12 : pt f32
  %14 = mul %4, %13 : el f32
  %15 = sub %3, %14 : el f32
  store "param" %15
}
)";

TEST_CASE("cuda ptx: a plan with a list reduction assembles for sm_80 and sm_90, without spills") {
  if (!std::filesystem::exists(kPtxas)) {
    skip_test(std::string(kPtxas) + " is absent (install the CUDA toolkit's ptxas to run this check)");
    return;
  }
  const PipelineResult r = run_pipeline(parse_graph(kGlobalClip));
  REQUIRE(r.kernels.size() == 2);
  const std::filesystem::path file = test::temp_path("list_kernel.ptx");
  for (const KernelPlan& kernel : r.kernels)
    for (int sm : {80, 90}) {
      INFO(kernel.name << " sm_" << sm);
      std::ofstream(file) << compile_gpu_kernel(kernel, sm).ptx;
      auto [status, out] =
          run(std::string(kPtxas) + " -v --gpu-name sm_" + std::to_string(sm) + " " + file.string() + " -o /dev/null");
      CHECK_MESSAGE(status == 0, out);
      CHECK_MESSAGE(out.find("0 bytes spill stores, 0 bytes spill loads") != std::string::npos, out);
    }
  std::filesystem::remove(file);
}

TEST_CASE("cuda ptx: a kernel reading hyperparameters on the device (f32 and f64) assembles for sm_80 and sm_90") {
  if (!std::filesystem::exists(kPtxas)) {
    skip_test(std::string(kPtxas) + " is absent (install the CUDA toolkit's ptxas to run this check)");
    return;
  }
  PipelineResult r = run_pipeline(parse_graph(R"(graph @on_device f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  %0 = hyper "lr" : pt f64
  %1 = hyper "decay" : pt f64
  %2 = tensor "param" : el f32
  %3 = tensor "grad" : el f32
  %4 = mul %0, %1 : pt f64
  %5 = cast %4 : pt f32
  %6 = mul %3, %5 : el f32
  %7 = sub %2, %6 : el f32
  store "param" %7
}
)"));
  REQUIRE(r.kernels.size() == 1);
  r.kernels.front().hypers_on_device = {{"lr", Dtype::f32}, {"decay", Dtype::f64}};
  const std::filesystem::path file = test::temp_path("on_device_kernel.ptx");
  for (int sm : {80, 90}) {
    INFO("sm_" << sm);
    const std::string ptx = compile_gpu_kernel(r.kernels.front(), sm).ptx;
    CHECK(ptx.find("ld.f32") != std::string::npos); // the value, loaded where its address points
    CHECK(ptx.find("ld.f64") != std::string::npos);
    std::ofstream(file) << ptx;
    auto [status, out] =
        run(std::string(kPtxas) + " -v --gpu-name sm_" + std::to_string(sm) + " " + file.string() + " -o /dev/null");
    CHECK_MESSAGE(status == 0, out);
  }
  std::filesystem::remove(file);
}

TEST_CASE("cuda ptx: the grad total kernels (2-norm, infinity norm, inf check) assemble for sm_80 and sm_90, without "
          "spills") {
  if (!std::filesystem::exists(kPtxas)) {
    skip_test(std::string(kPtxas) + " is absent (install the CUDA toolkit's ptxas to run this check)");
    return;
  }
  const std::filesystem::path file = test::temp_path("grad_total.ptx");
  using Norm = GpuGradTotalForm::Norm;
  for (GpuGradTotalForm form :
       {GpuGradTotalForm{Norm::l2, false}, GpuGradTotalForm{Norm::infinity, true}, GpuGradTotalForm{Norm::none, true}})
    for (int sm : {80, 90}) {
      INFO("sm_" << sm << ", norm " << static_cast<int>(form.norm) << (form.checks ? ", checked" : ""));
      const GpuKernelCode code = compile_gpu_grad_total(form, sm);
      CHECK(code.ptx.find(".entry " + code.entry) != std::string::npos);
      CHECK(code.ptx.find("bar.sync") != std::string::npos); // the tree over the block's threads
      std::ofstream(file) << code.ptx;
      auto [status, out] =
          run(std::string(kPtxas) + " -v --gpu-name sm_" + std::to_string(sm) + " " + file.string() + " -o /dev/null");
      CHECK_MESSAGE(status == 0, out);
      CHECK_MESSAGE(out.find("0 bytes spill stores, 0 bytes spill loads") != std::string::npos, out);
    }
  std::filesystem::remove(file);
}

TEST_CASE("cuda: a list reduction is combined between kernels on the GPU as on the CPU") {
  if (skip_without_gpu())
    return;
  const PipelineResult r = run_pipeline(parse_graph(kGlobalClip));
  std::vector<Tensor> cpu_params = random_params({{33, 7}, {170001}, {0}, {5}}, Dtype::f32, 9);
  randomize_grads(cpu_params, 4);
  std::vector<Tensor> gpu_params = on_device(cpu_params, Device::cuda(0));
  copy_grads(cpu_params, gpu_params);
  const auto run_on = [&](std::vector<Tensor>& params, Device device) {
    std::vector<Tensor> grads;
    for (const Tensor& p : params)
      grads.push_back(p.grad());
    ListArguments args;
    args.slot_names = {"param", "grad"};
    args.slot_tensors = {params, grads};
    args.hyper_names = {"lr"};
    args.hyper = {0.5};
    args.group_of.assign(params.size(), 0);
    const Target target = Target::for_device(device, Execution::Compiled);
    bool hit = false;
    std::unique_ptr<Executable> code = backend_for(target).load(r, target, CompileOptions{}, hit);
    code->bind(args);
    code->launch();
  };
  run_on(cpu_params, Device::cpu());
  run_on(gpu_params, Device::cuda(0));
  for (std::size_t i = 0; i < cpu_params.size(); ++i) {
    const std::vector<double> gpu = gpu_params[i].to(Device::cpu()).to_vector(), cpu = cpu_params[i].to_vector();
    for (std::size_t k = 0; k < cpu.size(); ++k) {
      INFO("param " << i << " element " << k);
      REQUIRE(gpu[k] == doctest::Approx(cpu[k]).epsilon(1e-5));
    }
  }
}

TEST_CASE("cuda: a list reduction spans params on the CPU and on the GPU, as on the CPU alone") {
  if (skip_without_gpu())
    return;
  // Params alternate between the host and the device: two buckets, one global norm, combined between their kernels.
  const auto clipped_sgd = [](Tracer& t) {
    Sym grads = t.tensors("grad");
    Sym coef = minimum(t.hyper("max_norm") / (sqrt(list_sum(sum(grads * grads))) + 1e-6), t.constant(1.0));
    t.store("param", foreach_add(t.tensors("param"), grads * coef, -t.hyper("lr")));
  };
  std::vector<Tensor> reference = random_params({{33, 7}, {170001}, {5}, {64, 3}}, Dtype::f32, 9);
  randomize_grads(reference, 4);
  std::vector<Tensor> mixed;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const Device device = i % 2 ? Device::cuda(0) : Device::cpu();
    mixed.push_back(reference[i].to(device));
    mixed.back().set_grad(reference[i].grad().to(device));
  }
  const std::map<std::string, double> hypers = {{"lr", 0.5}, {"max_norm", 0.25}};
  StepFunction on_cpu = compile_step("clipped_sgd", clipped_sgd, {.params = reference, .hypers = hypers});
  StepFunction on_both = compile_step("clipped_sgd", clipped_sgd, {.params = mixed, .hypers = hypers});
  on_cpu();
  on_both();
  CHECK_KERNELS(on_both, 4);
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const std::vector<double> got = mixed[i].to(Device::cpu()).to_vector(), want = reference[i].to_vector();
    for (std::size_t k = 0; k < want.size(); ++k) {
      INFO("param " << i << " element " << k);
      REQUIRE(got[k] == doctest::Approx(want[k]).epsilon(1e-5));
    }
  }
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

TEST_CASE("cuda: Muon's kernels and its products in cuBLAS on the GPU match the CPU forloop") {
  if (skip_without_gpu())
    return;
  // Tall, wide and square matrices, two of one shape (one batched product), a single row.
  const std::vector<Shape> shapes = {{24, 40}, {40, 24}, {24, 40}, {16, 16}, {1, 30}, {96, 320}};
  for (Dtype dtype : {Dtype::f32, Dtype::bf16})
    for (double f32_iterations : {0.0, 1.0}) {
      INFO(dtype_name(dtype) << (f32_iterations != 0 ? " f32 iterations" : " bf16 iterations"));
      const KeywordOptions options = {{"lr", {0.02}}, {"weight_decay", {0.1}}, {"f32_iterations", {f32_iterations}}};
      // bf16 iterations: cuBLAS and oneDNN sum each product in their own order, and a bf16 rounding that flips
      // moves the update by up to ~2% (the spread of bf16 Newton-Schulz, test_muon.cpp); f32 iterations agree to
      // f32 accumulation.
      const double products_atol = f32_iterations != 0 ? 1e-6 : 4 * 0.03 * 0.02 * 2;
      const int calls = check_gpu_against_forloop("muon", options, dtype, shapes, 4, 0, products_atol);
      // The same library calls as the CPU's compiled step makes (one batched product per shape and call).
      const std::vector<Tensor> cpu_params = random_params(shapes, dtype, 5);
      randomize_grads(cpu_params, 1);
      auto on_cpu = make_single_group("muon", cpu_params, options, true);
      CompiledStep cpu = compile(*on_cpu);
      CHECK(calls == cpu.library_call_count());
      CHECK(calls > 0);
    }
}

TEST_CASE("cuda: reductions (LAMB's norms, clipping's norm pass) on the GPU match the CPU forloop") {
  if (skip_without_gpu())
    return;
  for (Dtype dtype : {Dtype::f32, Dtype::f64})
    for (const CountConfig& c : reducing_configs()) {
      INFO(c.optimizer << " " << config_name(c.options) << " clip " << c.clip_norm_type << " " << dtype_name(dtype));
      // A tensor of many blocks (its partials combined by its last block), odd sizes, an empty one.
      check_gpu_against_forloop(c.optimizer, c.options, dtype, {{33, 7}, {5}, {170001}, {0}, {4, 4}}, 5,
                                c.clip_norm_type);
    }
}

TEST_CASE("cuda: every reducing configuration is bitwise the same run to run on the GPU") {
  if (skip_without_gpu())
    return;
  // Block partials combined by each tensor's last block in item order, then the host's list combine: an order the
  // shapes fix, never the blocks' timing. Two runs from the same inputs, each with its own optimizer and kernels.
  const std::vector<Shape> shapes = {{33, 7}, {5}, {1 << 20}, {0}, {300, 257}};
  for (const CountConfig& c : reducing_configs()) {
    INFO(c.optimizer << " " << config_name(c.options) << " clip " << c.clip_norm_type);
    std::vector<std::vector<double>> runs;
    for (int run = 0; run < 2; ++run) {
      std::vector<Tensor> params = on_device(random_params(shapes, Dtype::f32, 21), Device::cuda(0));
      const std::vector<Tensor> grads = on_device(random_params(shapes, Dtype::f32, 22), Device::cuda(0));
      for (std::size_t i = 0; i < params.size(); ++i)
        params[i].set_grad(grads[i]);
      auto opt = make_single_group(c.optimizer, params, c.options, true);
      if (c.clip_norm_type != 0)
        opt->set_grad_clipping(Optimizer::GradClipping{1.0, c.clip_norm_type, false});
      CompiledStep step = compile(*opt);
      for (int s = 0; s < 3; ++s)
        step();
      std::vector<double>& values = runs.emplace_back();
      for (const Tensor& p : params) {
        for (double v : p.to(Device::cpu()).to_vector())
          values.push_back(v);
        for (const auto& [key, t] : opt->visible_state(p))
          for (double v : t.to(Device::cpu()).to_vector())
            values.push_back(v);
      }
      if (c.clip_norm_type != 0)
        values.push_back(opt->total_grad_norm());
    }
    REQUIRE(runs[0].size() == runs[1].size());
    CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(double)) == 0);
  }
}

TEST_CASE("cuda: Adafactor's rows and columns on the GPU match the CPU forloop") {
  if (skip_without_gpu())
    return;
  // A matrix cut into 10 pieces of rows (gpu_launch_shape: 110 rows of 300), a batch of 2 cut into 2 each, a batch
  // of whole matrices, a single row, a single column, rows shorter than a warp.
  const std::vector<Shape> shapes = {{1000, 300}, {2, 400, 128}, {3, 40, 50}, {1, 4097}, {513, 1}, {700, 5}, {64}};
  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    INFO(dtype_name(dtype));
    check_gpu_against_forloop("adafactor", {}, dtype, shapes, 4);
    check_gpu_against_forloop("adafactor", {{"weight_decay", {0.1}}, {"maximize", {1}}}, dtype, shapes, 3, 2.0);
  }
}

TEST_CASE("cuda: the in-step inf check fills a found_inf on the device and skips, a finite step runs") {
  if (skip_without_gpu())
    return;
  std::vector<Tensor> ref = random_params({{33, 7}, {170001}, {0}}, Dtype::f32, 5);
  std::vector<Tensor> gpu = on_device(ref, Device::cuda(0));
  auto forloop = make_single_group("adam", ref, {}, false);
  auto compiled_opt = make_single_group("adam", gpu, {}, true);
  Tensor found_inf = Tensor::zeros({1}, Dtype::f32).to(Device::cuda(0));
  compiled_opt->set_grad_scaling(Tensor::full({1}, 4, Dtype::f32).to(Device::cuda(0)), found_inf,
                                 Optimizer::GradsAfterStep::Scaled, Optimizer::InfCheck::InStep);
  forloop->set_grad_scaling(Tensor::full({1}, 4, Dtype::f32), Tensor());
  CompiledStep compiled = compile(*compiled_opt);
  for (int s = 0; s < 3; ++s) {
    for (Tensor& p : ref)
      p.set_grad(Tensor::zeros(p.shape(), Dtype::f32));
    randomize_grads(ref, 300 + static_cast<uint64_t>(s));
    copy_grads(ref, gpu);
    if (s == 1) // the last element of the many-block tensor: found by its last block's combine
      gpu[1].grad().set_item(170000, std::numeric_limits<double>::quiet_NaN());
    found_inf.fill(0);
    const std::vector<double> before = gpu[1].to_vector();
    compiled();
    CHECK(found_inf.item() == (s == 1 ? 1 : 0));
    if (s == 1) {
      CHECK(gpu[1].to_vector() == before);
      continue;
    }
    forloop->step();
    check_same_trajectory(gpu, *compiled_opt, ref, *forloop, 1e-5, 1e-6, "in-step check: cuda vs cpu forloop");
  }
  CHECK(compiled.metrics().skipped_steps == 1);
}

TEST_CASE("cuda: a tensor lr on the GPU is read at every step, as a schedule fills it in place") {
  if (skip_without_gpu())
    return;
  std::vector<Tensor> ref = random_params({{33, 7}, {5}, {70001}}, Dtype::f32, 4);
  std::vector<Tensor> gpu = on_device(ref, Device::cuda(0));
  auto forloop = make_single_group("adam", ref, {}, false);
  auto opt = make_single_group("adam", gpu, {}, true);
  const Tensor lr = Tensor::full({}, 1.0, Dtype::f32).to(Device::cuda(0));
  opt->param_groups()[0].set("lr", lr);
  CompiledStep step = compile(*opt);
  for (int s = 0; s < 4; ++s) {
    const double value = std::ldexp(1.0, -5 - s); // exact in f32
    lr.fill(value);
    forloop->param_groups()[0].set("lr", value);
    for (Tensor& p : ref)
      p.set_grad(Tensor::zeros(p.shape(), Dtype::f32));
    randomize_grads(ref, 400 + static_cast<uint64_t>(s));
    copy_grads(ref, gpu);
    forloop->step();
    step();
  }
  check_same_trajectory(gpu, *opt, ref, *forloop, 1e-5, 1e-6, "tensor lr on the GPU");
  CHECK(step.metrics().compiles == 1);
  CHECK(step.dump(Stage::Fused).find("lr (f32 on device)") != std::string::npos); // read there, never copied back
}

TEST_CASE("cuda: a kernel whose registers allow fewer than 512 threads per block launches with fewer") {
  if (skip_without_gpu())
    return;
  // 24 f64 state lists, each s = s * h + g, summed into the update: 255 registers a thread (ptxas has no cap, so it
  // does not spill to fit 512 threads), where a block of 512, what a tensor of full chunks asks for, would not fit
  // one multiprocessor's registers: the launch takes 256.
  constexpr int kLists = 24;
  const auto name_of = [](const char* prefix, int k) { // (not prefix + std::to_string(k): GCC 12's -Wrestrict)
    std::string name = prefix;
    name += std::to_string(k);
    return name;
  };
  const auto body = [&](Tracer& t) {
    Sym total = t.constant(0.0);
    for (int k = 0; k < kLists; ++k) {
      const std::string name = name_of("s", k);
      const Sym s = t.tensors(name) * t.hyper(name_of("h", k)) + t.tensors("grad");
      t.store(name, s);
      total = total + s;
    }
    t.store("param", t.tensors("param") - total);
  };
  const auto lists_on = [&](Device device) {
    StepLists lists;
    lists.params = on_device(random_params({{1 << 20}, {3, 5000}}, Dtype::f64, 7), device);
    for (int k = 0; k < kLists; ++k) {
      lists.state.emplace_back(name_of("s", k),
                               on_device(random_params({{1 << 20}, {3, 5000}}, Dtype::f64, 100 + k), device));
      lists.hypers[name_of("h", k)] = 0.5 + 0.01 * k;
    }
    const std::vector<Tensor> grads = on_device(random_params({{1 << 20}, {3, 5000}}, Dtype::f64, 99), device);
    for (std::size_t i = 0; i < grads.size(); ++i)
      lists.params[i].set_grad(grads[i]);
    return lists;
  };
  StepLists cpu = lists_on(Device::cpu()), gpu = lists_on(Device::cuda(0));
  StepFunction on_cpu = compile_step("wide", body, cpu), on_gpu = compile_step("wide", body, gpu);
  on_cpu();
  on_gpu();
  for (std::size_t i = 0; i < cpu.params.size(); ++i) {
    CHECK(scaled_error(gpu.params[i].to(Device::cpu()), cpu.params[i], 1e-12, 1e-12) <= 1.0);
    CHECK(scaled_error(gpu.state[kLists - 1].second[i].to(Device::cpu()), cpu.state[kLists - 1].second[i], 1e-12,
                       1e-12) <= 1.0);
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

TEST_CASE("cuda: scalar state on the CPU (torch's steps that are not capturable) steps like the CPU forloop") {
  if (skip_without_gpu())
    return;
  // torch's placements: every scalar on the CPU (as its steps that are not capturable make them), or only `step`
  // (as its load_state_dict leaves a checkpoint's: it moves the other scalars, mu_product or eta, to the device).
  for (const bool only_step : {false, true})
    for (const auto& [name, options] : every_optimizer()) {
      INFO(name << std::string(only_step ? ", only step on the CPU" : ""));
      std::vector<Tensor> ref = random_params({{33, 7}, {70001}, {5}}, Dtype::f32, 8);
      std::vector<Tensor> gpu = on_device(ref, Device::cuda(0));
      auto forloop = make_single_group(name, ref, options, false);
      auto opt = make_single_group(name, gpu, options, true);
      for (Tensor& p : gpu) // ensure_state() makes the state of params with grads
        p.set_grad(Tensor::zeros(p.shape(), Dtype::f32, Device::cuda(0)));
      opt->ensure_state();
      const auto placed_as_asked = [&](const ParamState& state) {
        for (const auto& [key, t] : state)
          if (t.device() != (t.dim() == 0 && (key == "step" || !only_step) ? Device::cpu() : Device::cuda(0)))
            return false;
        return !state.empty();
      };
      for (std::size_t i = 0; i < gpu.size(); ++i) {
        ParamState state = opt->visible_state(gpu[i]);
        for (auto& [key, t] : state)
          if (t.dim() == 0 && (key == "step" || !only_step))
            t = t.to(Device::cpu());
        opt->adopt_state(static_cast<int64_t>(i), state, Optimizer::StateOrigin::Loaded);
        REQUIRE(placed_as_asked(opt->visible_state(gpu[i])));
      }
      CompiledStep step = compile(*opt);
      for (int s = 0; s < 5; ++s) {
        for (Tensor& p : ref)
          p.set_grad(Tensor::zeros(p.shape(), Dtype::f32));
        randomize_grads(ref, 90 + static_cast<uint64_t>(s));
        copy_grads(ref, gpu);
        forloop->step();
        step();
      }
      check_same_trajectory(gpu, *opt, ref, *forloop, 1e-5, 1e-6, "scalar state on the host");
      CHECK(placed_as_asked(opt->visible_state(gpu[0])));
      CHECK(step.metrics().compiles == 1);
    }
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
