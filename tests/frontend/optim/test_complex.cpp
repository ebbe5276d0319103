// Complex params (c64, c128) step as torch steps them: on their real view. Every optimizer in every mode follows,
// bit for bit, the same optimizer over real params holding the (re, im) pairs (the math is the same per component);
// state tensors are complex, scalar state real; Adagrad's sum and Rprop's step_size start at complex(v, v).
#include "frontend/optim/state_file.h"
#include "helpers.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

using namespace optjit;
using optjit::test::check_same_trajectory;
using optjit::test::every_optimizer;
using optjit::test::Mode;
using optjit::test::Run;
using optjit::test::Snapshot;

namespace {

const std::vector<Shape> kShapes = {{3, 5}, {7}, {}, {0}, {2, 3, 2}};

// Real params holding the components of `complex` (shape + [2]), as copies with copied grads.
std::vector<Tensor> real_copies(const std::vector<Tensor>& complex) {
  std::vector<Tensor> real;
  for (const Tensor& p : complex) {
    Tensor r = p.view_as_real().clone();
    r.set_grad(p.grad().view_as_real().clone());
    real.push_back(r);
  }
  return real;
}

// New grads for both runs, the same components; param 1 has no grad at step 1.
void set_grads(Run& complex, Run& real, int step) {
  for (Tensor& p : complex.params)
    p.set_grad(Tensor::zeros(p.shape(), p.dtype()));
  randomize_grads(complex.params, 50 + static_cast<uint64_t>(step));
  for (std::size_t i = 0; i < real.params.size(); ++i)
    real.params[i].set_grad(complex.params[i].grad().view_as_real().clone());
  if (step == 1) {
    complex.params[1].reset_grad();
    real.params[1].reset_grad();
  }
}

} // namespace

TEST_CASE("complex params: every optimizer in every mode steps them as real params of their components") {
  for (const auto& [name, options] : every_optimizer())
    for (Dtype dtype : {Dtype::c64, Dtype::c128})
      for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled}) {
        INFO(name << " " << dtype_name(dtype) << " mode " << static_cast<int>(mode));
        const std::vector<Tensor> initial = random_params(kShapes, dtype, 11);
        Run complex(name, options, initial, mode), real(name, options, real_copies(initial), mode);
        for (int step = 0; step < 5; ++step) {
          set_grads(complex, real, step);
          complex.step();
          real.step();
          for (std::size_t i = 0; i < complex.params.size(); ++i) {
            INFO("param " << i << " step " << step);
            CHECK(complex.params[i].view_as_real().to_vector() == real.params[i].to_vector());
            const ParamState cs = complex.opt->visible_state(complex.params[i]);
            const ParamState rs = real.opt->visible_state(real.params[i]);
            REQUIRE(cs.size() == rs.size());
            for (std::size_t k = 0; k < cs.size(); ++k) {
              INFO("state " << cs[k].first);
              const Tensor& c = cs[k].second;
              const bool scalar = rs[k].second.dim() == 0; // a real param's tensor state has at least its 2 components
              CHECK(c.dtype() == (scalar ? component_dtype(dtype) : dtype));
              CHECK(c.real_view().to_vector() == rs[k].second.to_vector());
            }
          }
        }
        if (complex.compiled)
          CHECK_KERNELS(*complex.compiled, 1);
      }
}

TEST_CASE("complex params: state files keep C128") {
  std::vector<Tensor> params = random_params({{4, 3}, {5}}, Dtype::c128, 4);
  auto opt = make_optimizer("adam", {ParamGroupSpec{params, {}}}, {{"amsgrad", {1}}});
  CompiledStep step = compile(*opt);
  step();
  const std::filesystem::path file = test::temp_path("c128_state.safetensors");
  save_state_dict(opt->state_dict(), file);
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(bytes.find("\"dtype\":\"C128\"") != std::string::npos);
  std::vector<Tensor> copies = copy_params(params);
  auto loaded = make_optimizer("adam", {ParamGroupSpec{copies, {}}}, {{"amsgrad", {1}}});
  loaded->load_state_dict(load_state_dict_file(file));
  std::filesystem::remove(file);
  check_same_trajectory(params, *opt, copies, *loaded, 0, 0, "loaded from the file");
  for (const auto& [key, t] : loaded->visible_state(copies[0]))
    CHECK(t.dtype() == (key == "step" ? Dtype::f64 : Dtype::c128));
}

TEST_CASE("complex params: state starts at complex(v, v), mixed dtypes compile one kernel each, state files keep C64") {
  std::vector<Tensor> params = random_params({{4, 3}, {5}}, Dtype::c64, 2);
  params.push_back(random_params({{6}}, Dtype::f32, 3)[0]);
  auto opt = make_optimizer("adagrad", {ParamGroupSpec{params, {}}}, {{"initial_accumulator_value", {0.25}}});
  CHECK(opt->visible_state(params[0])[1].second.view_as_real().to_vector() == std::vector<double>(24, 0.25));
  CompiledStep step = compile(*opt);
  step();
  CHECK_KERNELS(step, 2);

  const std::filesystem::path file = test::temp_path("complex_state.safetensors");
  save_state_dict(opt->state_dict(), file);
  std::vector<Tensor> copies = copy_params(params);
  auto loaded = make_optimizer("adagrad", {ParamGroupSpec{copies, {}}}, {{"initial_accumulator_value", {0.25}}});
  loaded->load_state_dict(load_state_dict_file(file));
  std::filesystem::remove(file);
  check_same_trajectory(params, *opt, copies, *loaded, 0, 0, "loaded from the file");
  CHECK(loaded->visible_state(copies[0])[1].second.dtype() == Dtype::c64);

  // A real state for a complex param is refused with the rule, and nothing changes.
  StateDict wrong = opt->state_dict();
  for (auto& [key, t] : wrong.state.at(0))
    if (key == "sum")
      t = Tensor::zeros(t.shape(), Dtype::f32);
  const Snapshot before(copies, *loaded);
  optjit::test::check_error([&] { loaded->load_state_dict(wrong); },
                            "state 'sum' of param 0 is f32[4, 3] on cpu, but the param is c64[4, 3] on cpu: a complex "
                            "param keeps complex state, a real param real state");
  CHECK(Snapshot(copies, *loaded) == before);
}

TEST_CASE("complex tensors: view_as_real shares memory, values go through it, conversions stay complex") {
  Tensor c = Tensor::zeros({2, 3}, Dtype::c64);
  Tensor r = c.view_as_real();
  CHECK(r.shape() == Shape{2, 3, 2});
  CHECK(r.strides() == Shape{6, 2, 1});
  CHECK(r.dtype() == Dtype::f32);
  CHECK(r.data() == c.data());
  r.set_item(3, 2.5); // element 1's imaginary part
  CHECK(c.to(Dtype::c128).view_as_real().item(3) == 2.5);
  CHECK(c.clone().view_as_real().to_vector() == r.to_vector());
  optjit::test::check_error([&] { (void)c.item(0); }, "item() of a complex tensor: use its real view (view_as_real)");
  optjit::test::check_error([&] { (void)Tensor::full({2}, 1, Dtype::c128); },
                            "set_item() of a complex tensor: use its real view (view_as_real)");
  optjit::test::check_error([&] { (void)c.to(Dtype::f32); },
                            "cannot convert c64[2, 3] on cpu to f32: complex tensors convert only to complex dtypes");
  optjit::test::check_error([&] { (void)r.view_as_real(); },
                            "f32[2, 3, 2] on cpu is not complex: view_as_real takes a complex tensor");
  Tensor outlived;
  {
    Tensor owner = Tensor::zeros({4}, Dtype::c128);
    outlived = owner.view_as_real();
  }
  outlived.fill(1); // the view keeps the storage alive
  CHECK(outlived.to_vector() == std::vector<double>(8, 1));
}
