// Master weights (group option master_weights=true): a bf16 or f16 param keeps an f32 copy in its state
// (`master_param`); every mode updates the master in f32 and rounds the param from it in the same pass, so the
// param is never read. The forloop reference is checked against an emulation (an f32 optimizer whose tensor state,
// but not its params, is rounded to the storage dtype after every step); every mode keeps param == round(master).
#include "frontend/optim/state_file.h"
#include "helpers.h"

#include <doctest/doctest.h>

#include <filesystem>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::every_optimizer;
using optjit::test::Mode;
using optjit::test::Run;
using optjit::test::scaled_error;
using optjit::test::Snapshot;

namespace {

const std::vector<Shape> kShapes = {{3, 5}, {7}, {}, {0}, {33}};

KeywordOptions with_master(KeywordOptions options) {
  options["master_weights"] = {1};
  return options;
}

// Param `i`'s master weights.
Tensor master_of(const Run& run, std::size_t i) {
  return find_state(run.opt->visible_state(run.params[i]), kMasterParam);
}

// The same grads for the low-precision run and, widened exactly, for the f32 emulation.
void set_grads(Run& low, Run& emulation, int step) {
  randomize_grads(low.params, 30 + static_cast<uint64_t>(step));
  for (std::size_t i = 0; i < low.params.size(); ++i)
    emulation.params[i].set_grad(low.params[i].grad().to(Dtype::f32));
}

// The emulation's tensor state rounded to `dtype` (its params stay f32: they are the master weights).
void round_state(const Run& emulation, Dtype dtype) {
  for (const StateSpec& spec : emulation.opt->new_state_specs(0))
    if (spec.kind == StateKind::Tensor)
      for (const Tensor& p : emulation.params)
        if (const Tensor t = find_state(emulation.opt->flat_state(&p - emulation.params.data()), spec.name);
            t.defined())
          t.copy_from(t.to(dtype).to(Dtype::f32));
}

} // namespace

TEST_CASE("master weights: every optimizer in every mode updates the f32 master and rounds the param from it") {
  for (const auto& [name, options] : every_optimizer())
    for (Dtype dtype : {Dtype::bf16, Dtype::f16}) {
      const std::vector<Tensor> initial = random_params(kShapes, dtype, 17);
      std::vector<Tensor> widened;
      for (const Tensor& p : initial) {
        widened.push_back(p.to(Dtype::f32));
        widened.back().set_grad(p.grad().to(Dtype::f32));
      }
      Run emulation(name, options, widened, Mode::Forloop);
      Run forloop(name, with_master(options), initial, Mode::Forloop);
      Run eager(name, with_master(options), initial, Mode::Eager);
      Run compiled(name, with_master(options), initial, Mode::Compiled);
      for (int step = 0; step < 5; ++step) {
        INFO(name << " " << dtype_name(dtype) << " step " << step);
        set_grads(forloop, emulation, step);
        for (Run* run : {&eager, &compiled})
          for (std::size_t i = 0; i < initial.size(); ++i)
            run->params[i].set_grad(forloop.params[i].grad().clone());
        emulation.opt->ensure_state(); // new state starts rounded too (Adagrad's sum, Rprop's step_size)
        round_state(emulation, dtype);
        emulation.step();
        round_state(emulation, dtype);
        for (Run* run : {&forloop, &eager, &compiled})
          run->step();
        for (std::size_t i = 0; i < initial.size(); ++i) {
          INFO("param " << i);
          CHECK(master_of(forloop, i).to_vector() == emulation.params[i].to_vector()); // the reference, exactly
          for (const Run* run : {&forloop, &eager, &compiled}) {
            const Tensor master = master_of(*run, i);
            CHECK(master.dtype() == Dtype::f32);
            CHECK(run->params[i].to_vector() == master.to(dtype).to_vector()); // rounded from the master
            CHECK(scaled_error(master, master_of(forloop, i), 1e-5, 1e-6) <= 1);
          }
        }
      }
      CHECK_KERNELS(*compiled.compiled, 1);
      CHECK(compiled.compiled->metrics().compiles == 1);
    }
}

TEST_CASE("master weights: the kernel never reads the low-precision param, and state files keep the f32 master") {
  std::vector<Tensor> params = random_params({{64}, {8, 8}}, Dtype::bf16, 4);
  auto opt = make_optimizer("adamw", {ParamGroupSpec{params, {}}}, {{"master_weights", {1}}, {"lr", {0.1}}});
  CompiledStep step = compile(*opt);
  step();
  const std::string fused = step.dump(Stage::Fused);
  CHECK(fused.find("tensor \"master_param\"") != std::string::npos);
  CHECK(fused.find("tensor \"param\"") == std::string::npos);

  const std::filesystem::path file = test::temp_path("master_weights.safetensors");
  save_state_dict(opt->state_dict(), file);
  std::vector<Tensor> copies = copy_params(params);
  auto loaded = make_optimizer("adamw", {ParamGroupSpec{copies, {}}}, {{"master_weights", {1}}, {"lr", {0.1}}});
  loaded->load_state_dict(load_state_dict_file(file));
  std::filesystem::remove(file);
  CHECK(find_state(loaded->visible_state(copies[0]), kMasterParam).dtype() == Dtype::f32);
  CompiledStep loaded_step = compile(*loaded);
  step();
  loaded_step();
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].to_vector() == copies[i].to_vector());
    CHECK(find_state(opt->visible_state(params[i]), kMasterParam).to_vector() ==
          find_state(loaded->visible_state(copies[i]), kMasterParam).to_vector());
  }
}

TEST_CASE("master weights: an f32 param in such a group is refused before any change, and turning it on recompiles") {
  std::vector<Tensor> params = random_params({{4}}, Dtype::f32, 1);
  auto opt = make_optimizer("sgd", {ParamGroupSpec{params, {}}}, {{"lr", {0.1}}, {"foreach", {1}}});
  CompiledStep step = compile(*opt);
  step();
  opt->param_groups()[0].set("master_weights", 1);
  const Snapshot before(params, *opt);
  const std::string message = "param 0 is f32[4] on cpu, in a group with master_weights=true: master weights are f32 "
                              "copies of bf16 and f16 params";
  check_error([&] { step(); }, message);
  check_error([&] { opt->step(); }, message);
  CHECK(Snapshot(params, *opt) == before);
}
