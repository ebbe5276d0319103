// torchao 0.18's low-bit Adam and AdamW (frontend/optim/lowbit_adam.h) against trajectories recorded from torchao's
// own compiled CPU step (tests/golden/lowbit/torchao_adam.json, tools/goldens/record_torchao_adam.py): after each of
// three steps, every param byte and every state byte (codes, scales, plain small-tensor state, step) hashes as
// torchao's did, in the forloop reference, the interpreted foreach step and the compiled step.
#include "frontend/optim/lowbit_adam.h"
#include "helpers.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include <cmath>
#include <fstream>

using namespace optjit;

namespace {

const nlohmann::json& recorded() {
  static const nlohmann::json data = [] {
    std::ifstream in(std::string(OPTJIT_TEST_GOLDEN_DIR) + "/lowbit/torchao_adam.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return data;
}

std::string fnv1a(const Tensor& t) {
  const Tensor dense = t.clone();
  const auto* bytes = static_cast<const uint8_t*>(dense.data());
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < dense.nbytes(); ++i)
    h = (h ^ bytes[i]) * 0x100000001b3ull;
  return fmt::format("{:016x}", h);
}

// The recorder's formulas: libm's cos and sin in double, rounded to the param's dtype.
Tensor param_values(const Shape& shape, int phase, Dtype dtype) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = std::cos(0.11 * static_cast<double>(i) + phase);
  return Tensor::from_values(shape, v, dtype);
}
Tensor grad_values(const Shape& shape, int phase, int step, double scale, Dtype dtype) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = std::sin(0.37 * static_cast<double>(i) + 1.3 * step + phase) * scale;
  return Tensor::from_values(shape, v, dtype);
}

KeywordOptions keywords(const nlohmann::json& options) {
  KeywordOptions out;
  for (const auto& [key, value] : options.items())
    out[key] = value.is_array() ? value.get<std::vector<double>>() : std::vector<double>{value.get<double>()};
  return out;
}

enum class Mode { Forloop, Foreach, Compiled };

} // namespace

TEST_CASE("lowbit adam: torchao's Adam/AdamW 8bit, 4bit and Fp8 steps, bit for bit in every mode") {
  const nlohmann::json& data = recorded();
  const auto scales = data.at("grad_scales").get<std::vector<double>>();
  for (const nlohmann::json& c : data.at("cases")) {
    const auto name = c.at("name").get<std::string>();
    const Dtype dtype = parse_dtype(c.at("dtype").get<std::string>());
    for (const Mode mode : {Mode::Forloop, Mode::Foreach, Mode::Compiled}) {
      CAPTURE(name);
      CAPTURE(dtype_name(dtype));
      CAPTURE(c.at("options").dump());
      CAPTURE(static_cast<int>(mode));
      std::vector<ParamGroupSpec> groups;
      std::vector<std::pair<Tensor, int>> params; // with their formula's phase
      int phase = 0;
      for (const nlohmann::json& g : c.at("groups")) {
        ParamGroupSpec spec;
        for (const auto& shape : g.at("shapes")) {
          params.emplace_back(param_values(shape.get<Shape>(), phase, dtype), phase);
          spec.params.push_back(params.back().first);
          ++phase;
        }
        for (const auto& [key, value] : g.items())
          if (key != "shapes")
            spec.options[key] = value.get<double>();
        groups.push_back(std::move(spec));
      }
      KeywordOptions options = keywords(c.at("options"));
      options["foreach"] = {mode == Mode::Forloop ? 0.0 : 1.0};
      auto opt = make_optimizer(name, std::move(groups), options);
      std::optional<CompiledStep> compiled;
      if (mode == Mode::Compiled)
        compiled.emplace(compile(*opt));
      for (int step = 0; step < 3; ++step) {
        CAPTURE(step);
        for (auto& [p, ph] : params)
          p.set_grad(grad_values(p.shape(), ph, step, scales.at(static_cast<std::size_t>(step)), dtype));
        compiled ? (*compiled)() : opt->step();
        const nlohmann::json& after = c.at("steps").at(static_cast<std::size_t>(step));
        for (std::size_t k = 0; k < params.size(); ++k) {
          CAPTURE(k);
          const nlohmann::json& expected = after.at(k);
          CHECK(fnv1a(params[k].first) == expected.at("param").at("hash").get<std::string>());
          const ParamState& state = opt->flat_state(static_cast<int64_t>(k));
          for (const auto& [key, entry] : expected.items()) {
            if (key == "param")
              continue;
            CAPTURE(key);
            const Tensor held = find_state(state, key);
            REQUIRE(held.defined());
            CHECK(dtype_name(held.dtype()) == dtype_name(parse_dtype(entry.at("dtype").get<std::string>())));
            CHECK(held.shape() == entry.at("shape").get<Shape>());
            CHECK(fnv1a(held) == entry.at("hash").get<std::string>());
          }
        }
      }
      if (compiled)
        CHECK(compiled->kernel_count() >= 1);
    }
  }
}

namespace {

// Every byte of every param and state entry, in order.
std::vector<std::string> snapshot(const Optimizer& opt) {
  std::vector<std::string> all;
  for (int64_t i = 0; i < opt.param_count(); ++i) {
    all.push_back(fnv1a(opt.flat_param(i)));
    for (const auto& [key, t] : opt.flat_state(i))
      all.push_back(fmt::format("{} {} {} {}", key, dtype_name(t.dtype()), shape_to_string(t.shape()), fnv1a(t)));
  }
  return all;
}

std::vector<Tensor> lowbit_params(Dtype dtype) {
  return {param_values({64, 128}, 0, dtype), param_values({1000}, 1, dtype), param_values({4096}, 2, dtype)};
}

void set_grads(std::vector<Tensor>& params, int step) {
  for (std::size_t k = 0; k < params.size(); ++k)
    params[k].set_grad(grad_values(params[k].shape(), static_cast<int>(k), step, 1.0, params[k].dtype()));
}

} // namespace

// f64 params compute in f32 as torchao's do (p.float(), then p.copy_), in every mode.
TEST_CASE("lowbit adam: amsgrad's max kept in 8 bits (torchao raises there) steps alike in every mode") {
  for (const auto& [name, dtype] : std::vector<std::pair<const char*, Dtype>>{{"AdamW8bit", Dtype::bf16},
                                                                              {"AdamW4bit", Dtype::bf16},
                                                                              {"AdamWFp8", Dtype::bf16},
                                                                              {"AdamW8bit", Dtype::f64}}) {
    CAPTURE(name);
    CAPTURE(dtype_name(dtype));
    std::vector<std::vector<std::string>> runs;
    for (const Mode mode : {Mode::Forloop, Mode::Foreach, Mode::Compiled}) {
      std::vector<Tensor> params = lowbit_params(dtype);
      auto opt = test::make_single_group(name, params, {{"amsgrad", {1}}, {"lr", {0.01}}}, mode != Mode::Forloop);
      std::optional<CompiledStep> compiled;
      if (mode == Mode::Compiled)
        compiled.emplace(compile(*opt));
      for (int step = 0; step < 4; ++step) {
        set_grads(params, step);
        compiled ? (*compiled)() : opt->step();
      }
      const Tensor held = find_state(opt->flat_state(0), "max_exp_avg_sq");
      CHECK(held.dtype() ==
            block_code_dtype(std::string(name) == "AdamWFp8" ? BlockFormat::Fp8 : BlockFormat::Signed8));
      CHECK(find_state(opt->flat_state(1), "max_exp_avg_sq").dtype() == dtype); // small: plain, the param's
      runs.push_back(snapshot(*opt));
    }
    CHECK(runs[1] == runs[0]);
    CHECK(runs[2] == runs[0]);
  }
}

TEST_CASE("lowbit adam: quantized state saves, loads and is adopted zero-copy, and steps on as if never moved") {
  for (const char* name : {"AdamW8bit", "AdamW4bit", "AdamWFp8"}) {
    CAPTURE(name);
    std::vector<Tensor> params = lowbit_params(Dtype::f32);
    auto opt = test::make_single_group(name, params, {}, true);
    CompiledStep step = compile(*opt);
    for (int s = 0; s < 2; ++s) {
      set_grads(params, s);
      step();
    }
    const StateDict saved = opt->state_dict();
    std::vector<Tensor> copies;
    for (const Tensor& p : params)
      copies.push_back(p.clone());
    auto loaded = test::make_single_group(name, copies, {}, true);
    loaded->load_state_dict(saved);
    CHECK(find_state(loaded->flat_state(0), "exp_avg").data() != find_state(opt->flat_state(0), "exp_avg").data());
    // Adopted: the same tensors, stepped in place.
    std::vector<Tensor> adopted_params;
    for (const Tensor& p : params)
      adopted_params.push_back(p.clone());
    auto adopted = test::make_single_group(name, adopted_params, {}, true);
    ParamState held = opt->flat_state(0);
    ParamState given;
    for (const auto& [key, t] : held)
      given.emplace_back(key, t.clone());
    adopted->adopt_state(0, given, Optimizer::StateOrigin::Loaded);
    for (int64_t i = 1; i < 3; ++i) {
      ParamState copy;
      for (const auto& [key, t] : opt->flat_state(i))
        copy.emplace_back(key, t.clone());
      adopted->adopt_state(i, copy, Optimizer::StateOrigin::Loaded);
    }
    CHECK(find_state(adopted->flat_state(0), "exp_avg").data() == find_state(given, "exp_avg").data());
    CHECK(find_state(adopted->flat_state(0), "exp_avg.scale").data() == find_state(given, "exp_avg.scale").data());
    CompiledStep loaded_step = compile(*loaded), adopted_step = compile(*adopted);
    for (int s = 2; s < 4; ++s) {
      set_grads(params, s);
      set_grads(copies, s);
      set_grads(adopted_params, s);
      step();
      loaded_step();
      adopted_step();
    }
    CHECK(snapshot(*loaded) == snapshot(*opt));
    CHECK(snapshot(*adopted) == snapshot(*opt));
  }
}

TEST_CASE("lowbit adam: bad block sizes and codes or scales that do not fit are refused by name, changing nothing") {
  test::check_error_contains(
      [] {
        (void)make_optimizer("AdamW4bit", {ParamGroupSpec{{Tensor::zeros({4096}, Dtype::f32)}, {}}},
                             {{"block_size", {127}}});
      },
      "Invalid block_size: 127.0 (AdamW4bit keeps whole blocks of 1 to 16384 values, an even number");
  test::check_error_contains(
      [] {
        (void)make_optimizer("AdamW8bit", {ParamGroupSpec{{Tensor::zeros({4096}, Dtype::f32)}, {}}},
                             {{"block_size", {0.5}}});
      },
      "Invalid block_size: 0.5");
  test::check_error_contains(
      [] {
        (void)make_optimizer("Adam8bit", {ParamGroupSpec{{Tensor::zeros({4096}, Dtype::f32)}, {}}},
                             {{"betas", {0.9, 1.0}}});
      },
      "Invalid beta parameter at index 1: 1.0");
  std::vector<Tensor> params = lowbit_params(Dtype::f32);
  auto opt = test::make_single_group("AdamW8bit", params, {}, true);
  const auto refused = [&](const std::string& key, const Tensor& t, const std::string& words) {
    ParamState given = {{"step", Tensor::zeros({}, Dtype::f32)},
                        {"exp_avg", Tensor::zeros({64, 128}, Dtype::u8)},
                        {"exp_avg.scale", Tensor::zeros({32}, Dtype::f32)},
                        {"exp_avg_sq", Tensor::zeros({64, 128}, Dtype::u8)},
                        {"exp_avg_sq.scale", Tensor::zeros({32}, Dtype::f32)}};
    for (auto& [k, v] : given)
      if (k == key)
        v = t;
    test::check_error_contains([&] { opt->adopt_state(0, given, Optimizer::StateOrigin::Loaded); }, words);
    CHECK(opt->flat_state(0).empty());
  };
  refused(
      "exp_avg.scale", Tensor::zeros({31}, Dtype::f32),
      "state 'exp_avg.scale' of param 0 is f32[31] on cpu: the param's 8192 values do not fall into 31 whole blocks");
  refused("exp_avg.scale", Tensor(), "its scales are missing, where one f32 scale per block is expected");
  refused("exp_avg_sq", Tensor::zeros({64, 127}, Dtype::u8), "state 'exp_avg_sq' of param 0 is u8[64, 127] on cpu");
  refused("exp_avg.scale", Tensor::zeros({32}, Dtype::bf16), "its scales are bf16[32] on cpu");
}
