// state_dict() / load_state_dict() through a state file: a loaded optimizer continues a trajectory bit for bit,
// on every optimizer and execution path; a mismatched state is an error that changes nothing.
#include "compiler/compiled_step.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/state_file.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_error_contains;
using optjit::test::check_same_trajectory;
using optjit::test::Snapshot;

namespace {

const std::vector<Shape> kShapes = {{3, 4}, {5}, {}, {0}, {6}};

// A state file removed when the test ends.
struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& name) : path(test::temp_path(name)) {}
  ~TempFile() { std::filesystem::remove(path); }
};

enum class Path { Forloop, Eager, Compiled };

// An optimizer over params in two groups (the second with its own lr), stepped on one of the three paths.
struct Run {
  std::vector<Tensor> params;
  std::unique_ptr<Optimizer> opt;
  std::optional<CompiledStep> compiled;

  Run(const std::string& name, const KeywordOptions& options, std::vector<Tensor> p, Path path) : params(std::move(p)) {
    KeywordOptions o = options;
    o["foreach"] = {path == Path::Forloop ? 0.0 : 1.0};
    opt = make_optimizer(
        name, {ParamGroupSpec{{params[0], params[1], params[2]}, {}}, ParamGroupSpec{{params[3], params[4]}, {}}}, o,
        {{}, {{"lr", {0.003}}}});
    if (path == Path::Compiled)
      compiled.emplace(compile(*opt));
  }
  // Step `step` of a fixed grad schedule: param 1 has no grad at step 1, param 4 none before step 4.
  void step(int step) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if ((i == 1 && step == 1) || (i == 4 && step < 4)) {
        params[i].reset_grad();
        continue;
      }
      params[i].set_grad(Tensor::zeros(params[i].shape(), params[i].dtype()));
      randomize_grads({params[i]}, 500 + static_cast<uint64_t>(step * 10) + i);
    }
    compiled ? (*compiled)() : opt->step();
  }
};

std::vector<Tensor> params_without_grads(const std::vector<Tensor>& params) {
  std::vector<Tensor> copies = copy_params(params);
  for (const Tensor& p : copies)
    p.reset_grad();
  return copies;
}

// Save after 3 steps, load into a fresh optimizer built with default options, continue 4 steps: bit for bit the
// uninterrupted run.
void check_round_trip(const std::string& name, const KeywordOptions& options) {
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16, Dtype::f16})
    for (Path path : {Path::Forloop, Path::Eager, Path::Compiled}) {
      INFO(name << " " << dtype_name(dtype) << " path " << static_cast<int>(path));
      const std::vector<Tensor> initial = random_params(kShapes, dtype, 77);
      Run uninterrupted(name, options, copy_params(initial), path);
      Run first(name, options, copy_params(initial), path);
      for (int s = 0; s < 3; ++s) {
        uninterrupted.step(s);
        first.step(s);
      }
      TempFile file("optjit_state_" + name + ".safetensors");
      save_state_dict(first.opt->state_dict(), file.path);
      Run resumed(name, {}, params_without_grads(first.params), path);
      resumed.opt->load_state_dict(load_state_dict_file(file.path));
      for (int s = 3; s < 7; ++s) {
        uninterrupted.step(s);
        resumed.step(s);
      }
      check_same_trajectory(resumed.params, *resumed.opt, uninterrupted.params, *uninterrupted.opt, 0, 0,
                            "resumed vs uninterrupted");
      if (resumed.compiled)
        CHECK(resumed.compiled->metrics().recompiles == 0); // None grads rebind, they do not recompile
    }
}

} // namespace

TEST_CASE("state_dict: save after 3 steps, load into a fresh optimizer, continue: bit for bit, every optimizer") {
  const std::vector<std::pair<std::string, KeywordOptions>> cases = {
      {"adam", {{"amsgrad", {1}}, {"weight_decay", {0.1}}, {"lr", {0.01}}}},
      {"adamw", {{"betas", {0.8, 0.9}}}},
      {"sgd", {{"momentum", {0.9}}, {"nesterov", {1}}, {"lr", {0.05}}}},
      {"nadam", {{"momentum_decay", {0.01}}, {"weight_decay", {0.1}}, {"decoupled_weight_decay", {1}}}},
      {"radam", {{"betas", {0.8, 0.95}}, {"lr", {0.01}}}},
      {"adamax", {{"weight_decay", {0.1}}}},
      {"adagrad", {{"lr_decay", {0.1}}, {"initial_accumulator_value", {0.2}}}},
      {"adadelta", {{"rho", {0.8}}, {"lr", {0.5}}}},
      {"rmsprop", {{"centered", {1}}, {"momentum", {0.5}}}},
      {"rprop", {{"etas", {0.3, 1.5}}, {"lr", {0.02}}}},
      {"asgd", {{"t0", {1}}, {"lambd", {0.01}}}}};
  for (const auto& [name, options] : cases)
    check_round_trip(name, options);
}

TEST_CASE("state_dict: the dict holds torch's layout: groups' options, params by index, state by index") {
  auto params = random_params({{2}, {3}, {4}}, Dtype::f32, 3);
  Adam opt({ParamGroupSpec{{params[0], params[1]}, {}}, ParamGroupSpec{{params[2]}, {{"lr", 0.5}}}});
  params[1].reset_grad();
  opt.step();
  StateDict dict = opt.state_dict();
  CHECK(dict.optimizer == "Adam");
  REQUIRE(dict.param_groups.size() == 2);
  CHECK(dict.param_groups[0].params == std::vector<int64_t>{0, 1});
  CHECK(dict.param_groups[1].params == std::vector<int64_t>{2});
  CHECK(dict.param_groups[1].options.at("lr") == 0.5);
  CHECK(dict.state.size() == 2); // param 1 had no grad: no state
  CHECK(dict.state.count(1) == 0);
  REQUIRE(dict.state.at(2).size() == 3);
  CHECK(dict.state.at(2)[0].first == "step");
  CHECK(dict.state.at(2)[0].second.item() == 1);
  // A snapshot: the dict's tensors are copies, later steps do not change them.
  opt.step();
  CHECK(dict.state.at(2)[0].second.item() == 1);
}

namespace {

// Loading `dict` (or the file it is saved to) into an Adam that has stepped twice throws `message` and changes
// nothing.
void check_load_refused(const StateDict& dict, const std::string& message) {
  auto params = random_params({{2, 2}, {3}}, Dtype::f32, 4);
  Adam opt({ParamGroupSpec{{params[0]}, {}}, ParamGroupSpec{{params[1]}, {}}});
  opt.step();
  opt.step();
  const Snapshot before(params, opt);
  check_error_contains([&] { opt.load_state_dict(dict); }, message);
  CHECK(Snapshot(params, opt) == before);
}

StateDict adam_dict() {
  auto params = random_params({{2, 2}, {3}}, Dtype::f32, 5);
  Adam opt({ParamGroupSpec{{params[0]}, {}}, ParamGroupSpec{{params[1]}, {}}}, {.lr = 0.5, .amsgrad = true});
  opt.step();
  return opt.state_dict();
}

} // namespace

TEST_CASE("state_dict: a mismatched state is refused with the reason and changes nothing") {
  StateDict wrong_optimizer = adam_dict();
  wrong_optimizer.optimizer = "NAdam";
  check_load_refused(wrong_optimizer, "loaded state dict is for NAdam, this optimizer is Adam");

  StateDict one_group = adam_dict();
  one_group.param_groups.pop_back();
  check_load_refused(one_group, "loaded state dict has a different number of parameter groups (1 saved, 2 here)");

  StateDict group_size = adam_dict();
  group_size.param_groups[1].params.push_back(7);
  check_load_refused(group_size, "loaded state dict contains a parameter group that doesn't match the size of "
                                 "optimizer's group (group 1: 2 params saved, 1 here)");

  StateDict shape = adam_dict();
  shape.state.at(0)[1].second = Tensor::zeros({4}, Dtype::f32);
  check_load_refused(shape, "state 'exp_avg' of param 0 has shape [4], the param has shape [2, 2]");

  StateDict missing_key = adam_dict();
  missing_key.state.at(1).pop_back(); // max_exp_avg_sq, which amsgrad needs
  check_load_refused(missing_key, "state of param 1 has keys {\"exp_avg\", \"exp_avg_sq\", \"step\"}, but Adam with "
                                  "these options keeps {\"exp_avg\", \"exp_avg_sq\", \"max_exp_avg_sq\", \"step\"}");

  StateDict bad_option = adam_dict();
  bad_option.param_groups[0].options["lr"] = -1;
  check_load_refused(bad_option, "Invalid learning rate: -1.0");

  StateDict unknown_option = adam_dict();
  unknown_option.param_groups[0].options["momentum"] = 0.9;
  check_load_refused(unknown_option, "loaded param group 0 has option 'momentum', which Adam does not have");

  StateDict stray_state = adam_dict();
  stray_state.state[9] = stray_state.state.at(0);
  check_load_refused(stray_state, "loaded state dict has state for param 9, which no parameter group lists");

  // Flags are 0 or 1, never coerced: a 0.5, a 2 or a NaN amsgrad is refused (issue 16, item 10).
  for (double flag : {0.5, 2.0, std::nan("")}) {
    StateDict bad_flag = adam_dict();
    bad_flag.param_groups[1].options["amsgrad"] = flag;
    check_load_refused(bad_flag, "loaded param group 1 of Adam has amsgrad = " +
                                     std::string(std::isnan(flag) ? "nan"
                                                 : flag == 2      ? "2.0"
                                                                  : "0.5") +
                                     ": a flag is 0 or 1 (false or true)");
  }
  // An older state dict without an option takes the optimizer's default (torch's test_can_load_older_state_dict).
  StateDict older = adam_dict();
  for (StateDict::Group& group : older.param_groups)
    group.options.erase("maximize");
  auto params = random_params({{2, 2}, {3}}, Dtype::f32, 5);
  Adam opt({ParamGroupSpec{{params[0]}, {}}, ParamGroupSpec{{params[1]}, {}}}, {.lr = 0.5, .amsgrad = true});
  opt.load_state_dict(older);
  CHECK(opt.param_groups()[0].get("maximize") == 0);
}

TEST_CASE("errors: a group's flag option other than 0 or 1 is refused at construction (issue 16, item 10)") {
  auto params = random_params({{3}}, Dtype::f32, 1);
  check_error(
      [&] {
        make_optimizer("adam", {ParamGroupSpec{params, {{"amsgrad", 2}}}}, {});
      },
      "param group 0 of Adam has amsgrad = 2.0: a flag is 0 or 1 (false or true)");
  check_error(
      [&] {
        make_optimizer("sgd", {ParamGroupSpec{params, {}}}, {{"lr", {0.1}}, {"nesterov", {0.5}}});
      },
      "SGD option 'nesterov' is 0.5: a flag is 0 or 1 (false or true)");
}

TEST_CASE("state_dict: files: round trip of every field, and clear errors for missing or corrupt files") {
  StateDict dict = adam_dict();
  dict.param_groups[0].options["eps"] = std::nan(""); // non-finite options survive too
  TempFile file("optjit_state_fields.safetensors");
  save_state_dict(dict, file.path);
  StateDict back = load_state_dict_file(file.path);
  CHECK(back.optimizer == dict.optimizer);
  REQUIRE(back.param_groups.size() == 2);
  CHECK(std::isnan(back.param_groups[0].options.at("eps")));
  back.param_groups[0].options["eps"] = dict.param_groups[0].options["eps"] = 1;
  CHECK(back.param_groups[0].options == dict.param_groups[0].options);
  CHECK(back.param_groups[1].options == dict.param_groups[1].options);
  CHECK(back.param_groups[1].params == dict.param_groups[1].params);
  for (const auto& [id, state] : dict.state)
    for (const auto& [key, tensor] : state) {
      Tensor loaded = find_state(back.state.at(id), key);
      REQUIRE(loaded.defined());
      CHECK(loaded.shape() == tensor.shape());
      CHECK(loaded.dtype() == tensor.dtype());
      CHECK(loaded.to_vector() == tensor.to_vector());
    }

  check_error_contains([] { load_state_dict_file("/nonexistent/optjit.safetensors"); },
                       "cannot read the optimizer state file /nonexistent/optjit.safetensors");
  const std::string bytes = [&] {
    std::ifstream in(file.path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  auto write = [&](const std::string& content) { std::ofstream(file.path, std::ios::binary) << content; };
  write(bytes.substr(0, bytes.size() - 4));
  check_error_contains([&] { load_state_dict_file(file.path); }, "data_offsets[1] is");
  write(bytes.substr(0, 5));
  check_error_contains([&] { load_state_dict_file(file.path); }, "shorter than the 8-byte header length");
  write("{\"not\": \"a state file\"}");
  check_error_contains([&] { load_state_dict_file(file.path); }, "is not an optjit optimizer state file");
}

TEST_CASE("state_dict: hooks: state_dict pre/post and load_state_dict pre/post, in order, prepend, removable") {
  auto params = random_params({{3}}, Dtype::f64, 6);
  Adam opt(params);
  opt.step();
  std::vector<std::string> calls;
  opt.register_state_dict_pre_hook([&](Optimizer&) { calls.push_back("pre"); });
  opt.register_state_dict_pre_hook([&](Optimizer&) { calls.push_back("pre-first"); }, /*prepend=*/true);
  HookHandle post = opt.register_state_dict_post_hook([&](Optimizer&, StateDict& d) {
    calls.push_back("post");
    d.param_groups[0].options["lr"] = 0.25; // a post hook may change the dict returned
  });
  StateDict dict = opt.state_dict();
  CHECK(calls == std::vector<std::string>{"pre-first", "pre", "post"});
  CHECK(dict.param_groups[0].options.at("lr") == 0.25);
  post.remove();
  post.remove(); // harmless twice
  CHECK(opt.state_dict().param_groups[0].options.at("lr") == 1e-3);

  calls.clear();
  opt.register_load_state_dict_pre_hook([&](Optimizer&, StateDict& d) {
    calls.push_back("load-pre");
    d.param_groups[0].options["lr"] = 0.125; // a pre hook may change what is loaded
  });
  opt.register_load_state_dict_post_hook([&](Optimizer& o) {
    calls.push_back("load-post");
    CHECK(o.param_groups()[0].get("lr") == 0.125);
  });
  opt.load_state_dict(dict);
  CHECK(calls == std::vector<std::string>{"load-pre", "load-post"});
}

TEST_CASE(
    "state_dict: files: a huge param id and a directory are optjit errors, not foreign exceptions (issue 16, 9)") {
  TempFile file("optjit_state_ids.safetensors");
  save_state_dict(adam_dict(), file.path);
  std::string bytes = [&] {
    std::ifstream in(file.path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  std::string header = bytes.substr(8, header_size);
  const std::string data = bytes.substr(8 + header_size);
  const auto at = header.find("\"state.0.");
  REQUIRE(at != std::string::npos);
  header.replace(at, 9, "\"state.99999999999999999999.");
  header_size = header.size();
  std::string changed(8, '\0');
  std::memcpy(changed.data(), &header_size, 8);
  std::ofstream(file.path, std::ios::binary) << changed << header << data;
  check_error_contains([&] { load_state_dict_file(file.path); },
                       "names param id 99999999999999999999, which is not a param index");

  const std::filesystem::path directory = std::filesystem::temp_directory_path();
  check_error_contains([&] { load_state_dict_file(directory); }, "it is not a regular file");
}

TEST_CASE(
    "state_dict: files: an option nested 100000 levels deep is a clear error, not a stack overflow (issue 16, 3)") {
  const std::string deep = std::string(100000, '[') + "0.1" + std::string(100000, ']');
  const std::string groups = "[{\"params\": [0], \"options\": {\"lr\": " + deep + "}}]";
  const std::string header = R"({"__metadata__": {"format": "optjit-optimizer-state", "version": "1", )"
                             R"("optimizer": "SGD", "param_groups": )" +
                             nlohmann::json(groups).dump() + "}}"; // param_groups is a JSON text in a string
  uint64_t header_size = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_size, 8);
  TempFile file("optjit_state_deep.safetensors");
  std::ofstream(file.path, std::ios::binary) << bytes << header;
  check_error_contains([&] { load_state_dict_file(file.path); }, "option 'lr' is an array of 1 value, not a number");
}

TEST_CASE("state_dict: files: shapes, offsets and ids are exact integers, one spelling per id (issue 16, item 10)") {
  TempFile file("optjit_state_strict.safetensors");
  save_state_dict(adam_dict(), file.path);
  const std::string bytes = [&] {
    std::ifstream in(file.path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size));
  const std::string data = bytes.substr(8 + header_size);
  auto file_bytes = [&](const nlohmann::json& changed) {
    const std::string text = changed.dump();
    const uint64_t size = text.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &size, 8);
    return out + text + data;
  };
  CHECK_NOTHROW(parse_state_dict_bytes(file_bytes(header)));

  nlohmann::json h = header;
  h["state.0.exp_avg"]["shape"][0] = 3.0; // nlohmann would read 3.0 (and 3.5) as 3
  check_error_contains([&] { parse_state_dict_bytes(file_bytes(h)); },
                       "tensor 'state.0.exp_avg' shape[0] is 3.0: expected an integer from 0 to");
  h = header;
  h["state.0.exp_avg"]["data_offsets"][1] = h["state.0.exp_avg"]["data_offsets"][1].get<double>() + 0.5;
  check_error_contains([&] { parse_state_dict_bytes(file_bytes(h)); }, "tensor 'state.0.exp_avg' data_offsets[1] is");
  h = header;
  h["state.0.exp_avg"]["shape"] = nlohmann::json::array();
  for (int d = 0; d < 65; ++d)
    h["state.0.exp_avg"]["shape"].push_back(1);
  check_error_contains([&] { parse_state_dict_bytes(file_bytes(h)); }, "at most 64 extents (kMaxTensorRank)");

  h = header;
  nlohmann::json groups = nlohmann::json::parse(h["__metadata__"]["param_groups"].get<std::string>());
  groups[0]["params"][0] = 0.5;
  h["__metadata__"]["param_groups"] = groups.dump();
  check_error_contains([&] { parse_state_dict_bytes(file_bytes(h)); },
                       "param_groups[0].params[0] is 0.5: expected an integer");

  h = header;
  h["state.00.step"] = h["state.0.step"]; // the same entry a second time, under another spelling of its id
  check_error_contains([&] { parse_state_dict_bytes(file_bytes(h)); },
                       "tensor 'state.00.step' writes param id 00 with a leading zero; ids are written as 0");

  std::string huge = file_bytes(header);
  const uint64_t too_long = kMaxStateFileHeaderBytes + 1;
  std::memcpy(huge.data(), &too_long, 8);
  check_error_contains([&] { parse_state_dict_bytes(huge); }, "more than the largest header, 104857600 bytes "
                                                              "(kMaxStateFileHeaderBytes)");
}

TEST_CASE("state_dict: after a structural option is switched off, the optimizer loads its own state dict (issue 16, "
          "item 7)") {
  struct Switch {
    std::string optimizer;
    KeywordOptions on;
    std::string option;
    std::string kept_key; // the entry the switched-off options no longer use
  };
  const std::vector<Switch> switches = {
      {"Adam", {{"amsgrad", {1}}}, "amsgrad", "max_exp_avg_sq"},
      {"SGD", {{"momentum", {0.9}}}, "momentum", "momentum_buffer"},
      {"RMSprop", {{"centered", {1}}}, "centered", "grad_avg"},
  };
  for (const Switch& s : switches)
    for (bool foreach : {false, true}) {
      INFO(s.optimizer << " " << s.option << std::string(foreach ? " foreach" : " forloop"));
      // Two twins take the same steps; one also saves and loads its state dict after the switch.
      auto initial = random_params({{4, 3}, {5}}, Dtype::f32, 9);
      std::vector<Tensor> pa = copy_params(initial), pb = copy_params(initial);
      auto a = test::make_single_group(s.optimizer, pa, s.on, foreach);
      auto b = test::make_single_group(s.optimizer, pb, s.on, foreach);
      a->step();
      b->step();
      for (auto* opt : {a.get(), b.get()})
        opt->param_groups()[0].set(s.option, 0.0);
      a->step();
      b->step();
      const StateDict saved = a->state_dict();
      REQUIRE(find_state(saved.state.at(0), s.kept_key).defined()); // torch keeps the entry too
      a->load_state_dict(saved);
      CHECK(find_state(a->visible_state(pa[0]), s.kept_key).defined());
      randomize_grads(pa, 3);
      randomize_grads(pb, 3);
      a->step();
      b->step();
      check_same_trajectory(pa, *a, pb, *b, 0, 0, "after the load");
      // Switched on again, both continue from the kept entry (SGD's buffer counts as started, as torch's does).
      for (auto* opt : {a.get(), b.get()})
        opt->param_groups()[0].set(s.option, s.on.begin()->second[0]);
      randomize_grads(pa, 4);
      randomize_grads(pb, 4);
      a->step();
      b->step();
      check_same_trajectory(pa, *a, pb, *b, 0, 0, "switched on again");
    }
  // A key that no options of the optimizer keep is still refused.
  auto params = random_params({{3}}, Dtype::f32, 1);
  auto adam = test::make_single_group("Adam", params, {}, true);
  adam->step();
  StateDict odd = adam->state_dict();
  odd.state.at(0).emplace_back("momentum_buffer", Tensor::zeros({3}, Dtype::f32));
  check_error_contains([&] { adam->load_state_dict(odd); }, "state of param 0 has keys {");
  // Nor is a master copy kept in a group without master weights: its presence would change the forloop's math.
  auto low = random_params({{3}}, Dtype::bf16, 2);
  auto master = test::make_single_group("Adam", low, {{"master_weights", {1}}}, false);
  master->step();
  StateDict without = master->state_dict();
  without.param_groups[0].options["master_weights"] = 0;
  check_error_contains([&] { master->load_state_dict(without); }, "master_param");
}

TEST_CASE("state_dict: AdamW's state loads into Adam(decoupled_weight_decay) and Adam's into AdamW, which stays "
          "decoupled (torch's test_adamw_serialization)") {
  auto params = random_params({{5, 5}, {5}}, Dtype::f32, 2);
  auto adamw = make_optimizer("AdamW", {ParamGroupSpec{params, {}}}, {});
  adamw->step();
  auto adam = make_optimizer("Adam", {ParamGroupSpec{params, {}}}, {{"decoupled_weight_decay", {1}}});
  adam->load_state_dict(adamw->state_dict());
  CHECK(adam->param_groups()[0].get("decoupled_weight_decay") == 1);
  CHECK(adam->state_dict().state.size() == 2);

  auto plain_adam = make_optimizer("Adam", {ParamGroupSpec{params, {}}}, {});
  const StateDict adam_dict = plain_adam->state_dict();
  CHECK(adam_dict.param_groups[0].options.at("decoupled_weight_decay") == 0);
  auto new_adamw = make_optimizer("AdamW", {ParamGroupSpec{params, {}}}, {});
  new_adamw->load_state_dict(adam_dict);
  CHECK(new_adamw->param_groups()[0].get("decoupled_weight_decay") == 1);
  // Other classes' state still needs the same class.
  auto sgd = make_optimizer("SGD", {ParamGroupSpec{params, {}}}, {});
  check_error_contains([&] { sgd->load_state_dict(adam_dict); },
                       "loaded state dict is for Adam, this optimizer is SGD");
}

TEST_CASE("state_dict: param names (torch >= 2.6's named state dicts) round-trip through state dicts and files "
          "(issue 16, item 7)") {
  auto params = random_params({{2, 3}, {4}, {5}}, Dtype::f32, 3);
  auto opt = make_optimizer(
      "Adam",
      {ParamGroupSpec{{params[0], params[1]}, {}, {"layer.weight", "layer.bias"}}, ParamGroupSpec{{params[2]}, {}}},
      {});
  opt->step();
  const StateDict saved = opt->state_dict();
  CHECK(saved.param_groups[0].param_names == std::vector<std::string>{"layer.weight", "layer.bias"});
  CHECK(saved.param_groups[1].param_names.empty());
  TempFile file("optjit_state_names.safetensors");
  save_state_dict(saved, file.path);
  const StateDict loaded = load_state_dict_file(file.path);
  CHECK(loaded.param_groups[0].param_names == saved.param_groups[0].param_names);
  CHECK(loaded.param_groups[1].param_names.empty());
  // Into an optimizer made without names: the loaded group takes them, as torch's does, and saves them again.
  auto plain =
      make_optimizer("Adam", {ParamGroupSpec{{params[0], params[1]}, {}}, ParamGroupSpec{{params[2]}, {}}}, {});
  plain->load_state_dict(loaded);
  CHECK(plain->state_dict().param_groups[0].param_names == saved.param_groups[0].param_names);
  StateDict unnamed = saved; // an unnamed dict keeps the optimizer's names, as torch's load_state_dict does
  unnamed.param_groups[0].param_names.clear();
  plain->load_state_dict(unnamed);
  CHECK(plain->state_dict().param_groups[0].param_names == saved.param_groups[0].param_names);
  CHECK(plain->deep_copy()->state_dict().param_groups[0].param_names == saved.param_groups[0].param_names);
  CHECK(plain->repr().find("    param_names: ['layer.weight', 'layer.bias']\n") != std::string::npos);

  StateDict bad = saved;
  bad.param_groups[0].param_names.pop_back();
  check_error_contains([&] { plain->load_state_dict(bad); }, "loaded param group 0 has 1 param names for 2 params");
  check_error_contains(
      [&] {
        make_optimizer("Adam", {ParamGroupSpec{{params[0], params[1]}, {}, {"only_one"}}}, {});
      },
      "param group 0 has 1 param names for 2 params: give one name per param, or none");
}
