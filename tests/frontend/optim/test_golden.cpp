// Every shared golden optimizer case, through all three execution paths.
#include "frontend/optim/registry.h"
#include "helpers.h"
#include "tools/golden.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>

using namespace optjit;

namespace {

std::vector<std::filesystem::path> golden_cases_of(const std::vector<std::string>& prefixes) {
  std::vector<std::filesystem::path> files;
  for (const auto& f : collect_golden_files({OPTJIT_TEST_GOLDEN_DIR}))
    for (const std::string& prefix : prefixes)
      if (f.filename().string().rfind(prefix, 0) == 0)
        files.push_back(f);
  return files;
}

void replay_all(const std::vector<std::string>& prefixes, std::size_t at_least) {
  const auto files = golden_cases_of(prefixes);
  CHECK(files.size() >= at_least);
  for (const auto& file : files)
    for (ReplayMode mode : {ReplayMode::Forloop, ReplayMode::Eager, ReplayMode::Compiled}) {
      ReplayResult r = replay_golden_file(file, mode);
      INFO(r.name << " [" << replay_mode_name(mode) << "]: " << r.failure);
      CHECK(r.passed);
      if (mode == ReplayMode::Compiled && r.passed) {
        // Golden cases change neither structure nor dtype between steps, except when a grad turns None.
        CHECK(r.metrics.steps == 7);
        CHECK(r.metrics.kernels_generated + r.metrics.cache_hits >= 1);
      }
    }
}

} // namespace

TEST_CASE("golden: every Adam case in forloop, eager and compiled modes") { replay_all({"adam_"}, 16); }
TEST_CASE("golden: every AdamW case in forloop, eager and compiled modes") { replay_all({"adamw_"}, 14); }
TEST_CASE("golden: every SGD case in forloop, eager and compiled modes") { replay_all({"sgd_"}, 16); }
TEST_CASE("golden: every Adamax case in forloop, eager and compiled modes") { replay_all({"adamax_"}, 12); }
TEST_CASE("golden: every Adagrad case in forloop, eager and compiled modes") { replay_all({"adagrad_"}, 12); }
TEST_CASE("golden: every RMSprop case in forloop, eager and compiled modes") { replay_all({"rmsprop_"}, 14); }
TEST_CASE("golden: every Adadelta case in forloop, eager and compiled modes") { replay_all({"adadelta_"}, 12); }

TEST_CASE("golden: every NAdam case in forloop, eager and compiled modes") { replay_all({"nadam_"}, 12); }
TEST_CASE("golden: every RAdam case in forloop, eager and compiled modes") { replay_all({"radam_"}, 10); }
TEST_CASE("golden: every Rprop case in forloop, eager and compiled modes") { replay_all({"rprop_"}, 10); }
TEST_CASE("golden: every ASGD case in forloop, eager and compiled modes") { replay_all({"asgd_"}, 12); }
TEST_CASE("golden: every LR scheduler case in forloop, eager and compiled modes") { replay_all({"sched_"}, 13); }

namespace {

// A copy of a golden case with one field changed, in a temporary file removed when the test ends.
struct EditedCase {
  std::filesystem::path path;
  EditedCase(const std::string& case_name, const std::function<void(nlohmann::json&)>& edit) {
    const auto files = golden_cases_of({case_name});
    REQUIRE(files.size() == 1);
    std::ifstream in(files[0]);
    nlohmann::json c = nlohmann::json::parse(in);
    edit(c);
    path = test::temp_path("edited_" + case_name + ".json");
    std::ofstream(path) << c.dump();
  }
  ~EditedCase() { std::filesystem::remove(path); }
};

} // namespace

TEST_CASE("golden: a case of an optimizer optjit does not have fails with a clear message") {
  EditedCase lbfgs("rprop_defaults_single", [](nlohmann::json& c) { c["optimizer"] = "LBFGS"; });
  ReplayResult r = replay_golden_file(lbfgs.path, ReplayMode::Compiled);
  CHECK_FALSE(r.passed);
  CHECK(r.failure.find("unknown optimizer 'LBFGS'") != std::string::npos);
}

TEST_CASE("golden: a wrong expectation is reported with step, param, index, got and expected") {
  EditedCase corrupt("adam_defaults_single", [](nlohmann::json& c) { c["steps"][0]["expect_params"][0][0] = 1000.5; });
  ReplayResult r = replay_golden_file(corrupt.path, ReplayMode::Compiled);
  CHECK_FALSE(r.passed);
  CHECK(r.failure.find("step 0, param 0, index 0, got ") != std::string::npos);
  CHECK(r.failure.find("expected 1000.5") != std::string::npos);
}

namespace {

// Replays a copy of a shared golden case changed by `mutate`, in every mode; every mode must fail with `message`.
void check_mutated_case_fails(const std::function<void(nlohmann::json&)>& mutate, const std::string& message) {
  std::ifstream in(std::string(OPTJIT_TEST_GOLDEN_DIR) + "/adam_defaults_foreach.json");
  nlohmann::json c = nlohmann::json::parse(in);
  mutate(c);
  // A file of its own per expected message: ctest runs the test cases that call this in parallel.
  const std::filesystem::path file =
      test::temp_path("mutated_case_" + std::to_string(std::hash<std::string>{}(message)) + ".json");
  std::ofstream(file) << c.dump();
  for (ReplayMode mode : {ReplayMode::Forloop, ReplayMode::Eager, ReplayMode::Compiled}) {
    ReplayResult r = replay_golden_file(file, mode);
    INFO(replay_mode_name(mode) << ": " << r.failure);
    CHECK_FALSE(r.passed);
    CHECK(r.failure.find(message) != std::string::npos);
  }
  std::filesystem::remove(file);
}

} // namespace

TEST_CASE(
    "golden replay: a case with short per-step lists, no steps or no params fails, never passes (issue 16, 4, 11)") {
  check_mutated_case_fails([](nlohmann::json& c) { c["steps"][0]["grads"] = nlohmann::json::array(); },
                           "step 0: 'grads' has 0 entries for 5 params");
  check_mutated_case_fails([](nlohmann::json& c) { c["steps"][2]["expect_state"].erase(1); },
                           "step 2: 'expect_state' has 4 entries for 5 params");
  check_mutated_case_fails([](nlohmann::json& c) { c["steps"] = nlohmann::json::array(); }, "the case has no steps");
  check_mutated_case_fails([](nlohmann::json& c) { c["params"] = nlohmann::json::array(); },
                           "optimizer got an empty parameter list");
}

TEST_CASE("golden replay: shapes and param indices are exact integers in range, checked before allocating (issue 16)") {
  check_mutated_case_fails([](nlohmann::json& c) { c["params"][0]["shape"][0] = 10.5; },
                           "a param's shape[0] is 10.5: expected an integer from 0 to");
  check_mutated_case_fails(
      [](nlohmann::json& c) {
        c["params"][0]["shape"] = {4294967296, 4294967296};
      },
      "more than the largest tensor, 2^48 bytes (kMaxTensorBytes)");
  // A shape of 2^40 elements with a few values: refused by its count before 4 TB are asked for.
  check_mutated_case_fails([](nlohmann::json& c) { c["params"][0]["shape"] = {int64_t{1} << 40}; },
                           "tensor of shape [1099511627776] needs 1099511627776 values, got");
  check_mutated_case_fails(
      [](nlohmann::json& c) {
        c["param_groups"] = nlohmann::json::array({{{"params", {0, 1, 2, 3, 4}}}, {{"params", {1e10}}}});
      },
      "a param group's param index is 10000000000.0: expected an integer from 0 to 4");
}

TEST_CASE("golden replay: a case that breaks the JSON format says so, with nlohmann's reason (issue 16, item 9)") {
  check_mutated_case_fails([](nlohmann::json& c) { c.erase("rtol"); },
                           "the case does not follow the golden format (tests/golden/README.md): ");
  check_mutated_case_fails([](nlohmann::json& c) { c["optimizer"] = 3; }, "the golden format");
  const ReplayResult text = replay_golden_text("{\"name\": ", "cut", ReplayMode::Eager);
  CHECK_FALSE(text.passed);
  CHECK(text.name == "cut");
  CHECK(text.failure.find("the case does not follow the golden format") != std::string::npos);
}
